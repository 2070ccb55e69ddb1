import NIOCore
@_spi(Stacks) import QXferCore

/// A transport established by one of a race's stacks, which it names as the stack carrying the
/// connection: the connection words errors and answers `stackName` and
/// `hasIndependentStreams` as that stack. Extra streams opened on it are wrapped the same way.
struct RacedTransport: ByteStreamTransport {
    let inner: any ByteStreamTransport
    let stack: any TransportStack
    /// Set when `stack` led alone with early data to this endpoint (no race): a failure to
    /// connect is then ``EarlyDataUnanswered``, and the next connection there races.
    let earlyTo: Endpoint?

    init(_ inner: any ByteStreamTransport, stack: any TransportStack, earlyTo: Endpoint? = nil) {
        self.inner = inner
        self.stack = stack
        self.earlyTo = earlyTo
    }

    var carryingStack: (any TransportStack)? { stack }
    var peer: PeerIdentity { inner.peer }
    func write(_ buffer: ByteBuffer) async throws { try await early { try await inner.write(buffer) } }
    func read() async throws -> [ByteBuffer]? { try await early { try await inner.read() } }
    func read(atLeast minimum: Int) async throws -> [ByteBuffer]? { try await early { try await inner.read(atLeast: minimum) } }
    func finish() async throws { try await early { try await inner.finish() } }
    func reset(errorCode: UInt64) { inner.reset(errorCode: errorCode) }
    func close() { inner.close() }
    func waitUntilCloseSent(within timeout: Duration) async { await inner.waitUntilCloseSent(within: timeout) }
    var multiplexer: (any StreamMultiplexer)? { inner.multiplexer.map { RacedMultiplexer(inner: $0, stack: stack, earlyTo: earlyTo) } }

    private func early<T>(_ operation: () async throws -> T) async throws -> T {
        try await Self.early(to: earlyTo, over: stack, operation)
    }

    /// Runs `operation`; on a connection that led with early data to `endpoint`, a failure to
    /// connect (the handshake's deadline passed unanswered) becomes ``EarlyDataUnanswered``.
    static func early<T>(to endpoint: Endpoint?, over stack: any TransportStack, _ operation: () async throws -> T) async throws -> T {
        guard let endpoint else { return try await operation() }
        do {
            return try await operation()
        } catch let error as QXferError where error.code == .connectFailed {
            RaceStack.unansweredEarly.withLock { _ = $0.insert(endpoint) }
            throw QXferError(.connectFailed, error.message, underlying: EarlyDataUnanswered(endpoint: endpoint, stack: stack.name))
        }
    }
    func metrics() async -> ConnectionMetrics { await inner.metrics() }
    func exportKeyingMaterial(label: String, context: [UInt8], length: Int) async throws -> [UInt8] {
        try await inner.exportKeyingMaterial(label: label, context: context, length: length)
    }
    var hasEnded: Bool { get async { await inner.hasEnded } }
}

/// The winner's multiplexer, handing out streams that name the winner too.
struct RacedMultiplexer: StreamMultiplexer {
    let inner: any StreamMultiplexer
    let stack: any TransportStack
    var earlyTo: Endpoint? = nil

    func openStream() async throws -> any ByteStreamTransport {
        RacedTransport(try await RacedTransport.early(to: earlyTo, over: stack) { try await inner.openStream() }, stack: stack, earlyTo: earlyTo)
    }
    func acceptStream() async throws -> (any ByteStreamTransport)? {
        try await inner.acceptStream().map { RacedTransport($0, stack: stack, earlyTo: earlyTo) }
    }
    func sendDatagram(_ payload: ByteBuffer) async throws { try await inner.sendDatagram(payload) }
    func receiveDatagram() async throws -> ByteBuffer? { try await inner.receiveDatagram() }
    func maximumDatagramSize() async -> Int? { await inner.maximumDatagramSize() }
    func migrate(localHost: String?) async throws { try await inner.migrate(localHost: localHost) }
    func close(errorCode: UInt64, reason: String) { inner.close(errorCode: errorCode, reason: reason) }
}
