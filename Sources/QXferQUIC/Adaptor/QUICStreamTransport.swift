import NIOCore
import QUICEngine
@_spi(Stacks) import QXferCore


/// A QUIC stream seen as a ``ByteStreamTransport``.
///
/// The connection's primary stream (the client's first bidirectional stream) closes the whole
/// connection when closed; any other stream closing resets just itself.
final class QUICStreamTransport: ByteStreamTransport {
    let peer: PeerIdentity
    private let driver: NIOLoopBound<QUICConnectionDriver>
    private let stream: EventLoopFuture<QUICStreamID>
    private let eventLoop: any EventLoop
    private let isPrimary: Bool

    init(driver: NIOLoopBound<QUICConnectionDriver>, stream: EventLoopFuture<QUICStreamID>, peer: PeerIdentity, isPrimary: Bool = true) {
        self.driver = driver
        self.stream = stream
        self.peer = peer
        self.eventLoop = driver.eventLoop
        self.isPrimary = isPrimary
    }

    func write(_ buffer: ByteBuffer) async throws {
        let driver = self.driver
        try await stream.flatMap { driver.value.write(buffer, on: $0) }.get()
    }

    func read() async throws -> [ByteBuffer]? {
        try await read(atLeast: 1)
    }

    func read(atLeast minimum: Int) async throws -> [ByteBuffer]? {
        let driver = self.driver
        return try await stream.flatMap { driver.value.read($0, atLeast: minimum) }.get()
    }

    func finish() async throws {
        let driver = self.driver
        try await stream.flatMap { driver.value.finish($0) }.get()
    }

    func reset(errorCode: UInt64) {
        let driver = self.driver
        stream.whenSuccess { driver.value.reset($0, errorCode: errorCode) }
    }

    func close() {
        if isPrimary {
            let driver = self.driver
            eventLoop.execute { driver.value.closeGracefully() }
        } else {
            reset(errorCode: 0)
        }
    }

    /// Waits for the connection's close, whichever stream began it (an extra stream's reset
    /// alone has nothing to wait for).
    func waitUntilCloseSent(within timeout: Duration) async {
        let driver = self.driver
        let limit = TimeAmount.nanoseconds(Int64(clamping: timeout.quicNanoseconds))
        try? await eventLoop.flatSubmit { driver.value.whenCloseSent(within: limit) }.get()
    }

    func metrics() async -> ConnectionMetrics {
        let driver = self.driver
        return (try? await eventLoop.submit { driver.value.metrics }.get()) ?? ConnectionMetrics()
    }

    var hasEnded: Bool {
        get async {
            let driver = self.driver
            return (try? await eventLoop.submit { driver.value.closeError != nil }.get()) ?? true
        }
    }

    var multiplexer: (any StreamMultiplexer)? { QUICMultiplexer(driver: driver, peer: peer) }

    func exportKeyingMaterial(label: String, context: [UInt8], length: Int) async throws -> [UInt8] {
        let driver = self.driver
        return try await eventLoop.submit {
            do {
                return try driver.value.engine.exportKeyingMaterial(label: label, context: context, length: length)
            } catch {
                throw QXferError(.invalidUse, "cannot export keying material: \(error)")
            }
        }.get()
    }
}
