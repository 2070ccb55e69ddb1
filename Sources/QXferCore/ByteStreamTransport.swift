import NIOCore

/// An established, reliable, ordered byte stream under a ``NetworkConnection``.
///
/// The TCP+TLS stack provides one per connection; the QUIC stack one per stream. Framers and
/// applications see only this, which is what lets them run unchanged on either stack.
@_spi(Stacks) public protocol ByteStreamTransport: Sendable {
    /// Who the peer is and why it was admitted.
    var peer: PeerIdentity { get }
    /// Queues `buffer` and returns once the transport has taken it; suspends while the
    /// transport's buffers are full, so a slow path slows the sender.
    func write(_ buffer: ByteBuffer) async throws
    /// Whatever has arrived since the last call (at least one byte), or nil once the peer has
    /// finished sending. A single reader at a time.
    func read() async throws -> [ByteBuffer]?
    /// Like ``read()``, but returns only once `minimum` bytes have arrived (or the stream
    /// ended, or failed, with fewer): a framer waiting for the rest of a message asks for it
    /// at once, and a transport that gathers it where it arrives spares the reader a wake-up
    /// for every packet.
    func read(atLeast minimum: Int) async throws -> [ByteBuffer]?
    /// Ends the sending direction after what was written; the peer's reads then end.
    func finish() async throws
    /// Abandons the stream in both directions with an application error code.
    func reset(errorCode: UInt64)
    /// Closes both directions; idempotent, never waits.
    func close()
    /// Returns once a close begun with ``close()`` (or the multiplexer's) has left this
    /// process, or once `timeout` has passed, which also bounds what a graceful close still
    /// waits for. A stack that runs in the process (QUIC) would lose an unsent close, and the
    /// peer would wait for its idle timeout.
    func waitUntilCloseSent(within timeout: Duration) async
    /// More streams and datagrams on the same connection; nil where the transport has only
    /// one ordered byte stream (TCP+TLS).
    var multiplexer: (any StreamMultiplexer)? { get }
    /// Path measurements.
    func metrics() async -> ConnectionMetrics
    /// A TLS exporter value of the connection (RFC 8446 section 7.5).
    func exportKeyingMaterial(label: String, context: [UInt8], length: Int) async throws -> [UInt8]
    /// Whether the peer has closed the connection or finished sending, seen without reading.
    var hasEnded: Bool { get async }
    /// The stack that carries this transport when it is not the one the connection declared
    /// (a stack racing several answers with the winner); nil means the declared stack.
    var carryingStack: (any TransportStack)? { get }
}

extension ByteStreamTransport {
    @_spi(Stacks) public var hasEnded: Bool { get async { false } }

    @_spi(Stacks) public func waitUntilCloseSent(within timeout: Duration) async {}

    @_spi(Stacks) public var carryingStack: (any TransportStack)? { nil }

    @_spi(Stacks) public func exportKeyingMaterial(label: String, context: [UInt8], length: Int) async throws -> [UInt8] {
        throw QXferError(.unsupported, "this transport offers no TLS exporter")
    }
}

/// A connection that carries many streams and unreliable datagrams (QUIC).
@_spi(Stacks) public protocol StreamMultiplexer: Sendable {
    /// Opens a new bidirectional stream, waiting while the peer's stream limit is reached.
    func openStream() async throws -> any ByteStreamTransport
    /// The next stream the peer opened; nil once the connection is closed.
    func acceptStream() async throws -> (any ByteStreamTransport)?
    /// Sends one unreliable datagram; throws if it is larger than ``maximumDatagramSize()``.
    func sendDatagram(_ payload: ByteBuffer) async throws
    /// The next datagram received; nil once the connection is closed.
    func receiveDatagram() async throws -> ByteBuffer?
    /// The largest datagram payload the path and the peer accept now; nil if the peer takes none.
    func maximumDatagramSize() async -> Int?
    /// Moves the connection to a new local socket (a new port, or `localHost`), as when a
    /// device changes network; the peer validates the new path and the connection goes on.
    func migrate(localHost: String?) async throws
    /// Closes the whole connection with an application error code and reason for the peer,
    /// once what was sent has been delivered.
    func close(errorCode: UInt64, reason: String)
}

extension ByteStreamTransport {
    /// Returns what ``read()`` returns: for a transport that does not gather.
    public func read(atLeast minimum: Int) async throws -> [ByteBuffer]? { try await read() }
}
