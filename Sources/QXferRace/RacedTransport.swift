import NIOCore
@_spi(Stacks) import QXferCore

/// A transport established by one of a race's stacks, which it names as the stack carrying the
/// connection: the connection words errors and answers `stackName` and
/// `hasIndependentStreams` as that stack. Extra streams opened on it are wrapped the same way.
struct RacedTransport: ByteStreamTransport {
    let inner: any ByteStreamTransport
    let stack: any TransportStack

    init(_ inner: any ByteStreamTransport, stack: any TransportStack) {
        self.inner = inner
        self.stack = stack
    }

    var carryingStack: (any TransportStack)? { stack }
    var peer: PeerIdentity { inner.peer }
    func write(_ buffer: ByteBuffer) async throws { try await inner.write(buffer) }
    func read() async throws -> [ByteBuffer]? { try await inner.read() }
    func read(atLeast minimum: Int) async throws -> [ByteBuffer]? { try await inner.read(atLeast: minimum) }
    func finish() async throws { try await inner.finish() }
    func reset(errorCode: UInt64) { inner.reset(errorCode: errorCode) }
    func close() { inner.close() }
    var multiplexer: (any StreamMultiplexer)? { inner.multiplexer.map { RacedMultiplexer(inner: $0, stack: stack) } }
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

    func openStream() async throws -> any ByteStreamTransport { RacedTransport(try await inner.openStream(), stack: stack) }
    func acceptStream() async throws -> (any ByteStreamTransport)? {
        try await inner.acceptStream().map { RacedTransport($0, stack: stack) }
    }
    func sendDatagram(_ payload: ByteBuffer) async throws { try await inner.sendDatagram(payload) }
    func receiveDatagram() async throws -> ByteBuffer? { try await inner.receiveDatagram() }
    func maximumDatagramSize() async -> Int? { await inner.maximumDatagramSize() }
    func migrate(localHost: String?) async throws { try await inner.migrate(localHost: localHost) }
    func close(errorCode: UInt64, reason: String) { inner.close(errorCode: errorCode, reason: reason) }
}
