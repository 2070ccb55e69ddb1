import NIOCore

/// An established, reliable, ordered byte stream under a ``NetworkConnection``.
///
/// The TCP+TLS stack provides one per connection; the QUIC stack one per stream. Framers and
/// applications see only this, which is what lets them run unchanged on either stack.
protocol ByteStreamTransport: Sendable {
    /// Who the peer is and why it was admitted.
    var peer: PeerIdentity { get }
    /// Queues `buffer` and returns once the transport has taken it; suspends while the
    /// transport's buffers are full, so a slow path slows the sender.
    func write(_ buffer: ByteBuffer) async throws
    /// Whatever has arrived since the last call (at least one byte), or nil once the peer has
    /// finished sending. A single reader at a time.
    func read() async throws -> [ByteBuffer]?
    /// Closes both directions; idempotent, never waits.
    func close()
    /// Path measurements.
    func metrics() async -> ConnectionMetrics
}
