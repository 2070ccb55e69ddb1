import NIOCore
import QUICEngine

/// What the endpoint (``QUICSocketHandler``) needs of a connection it carries.
///
/// ``QUICConnectionDriver`` conforms; the endpoint knows nothing else of it, so the driver
/// depends on the endpoint and never the reverse: the endpoint hands datagrams and socket
/// events down to this protocol, the driver calls the endpoint's methods to send and to route
/// its connection IDs. Everything runs on the socket's event loop.
protocol QUICEndpointConnection: AnyObject {
    /// The connection's engine: its connection IDs and its state.
    var engine: QUICConnection { get }
    /// The endpoint the connection sends through; set by the endpoint that attaches it, nil
    /// while it has none (its socket died and a new one is being bound).
    var endpoint: QUICSocketHandler? { get set }
    /// Completed with the negotiated ALPN when the handshake completes; failed if it does not.
    var handshakeResult: EventLoopFuture<String> { get }
    /// Hands one received datagram, read at `now`, to the engine; ``process()`` follows after a batch.
    func receive(_ datagram: UnsafeRawBufferPointer, path: QUICPath, now: QUICTime)
    /// Drains the engine's events, sends what is ready, re-arms the timer.
    func process()
    /// The socket takes writes again after backpressure.
    func socketWritable()
    /// The socket closed: nothing can be sent any more.
    func socketClosed()
    /// The socket died under the established connection: the connection goes on from a new one.
    func socketDied()
    /// Closes the connection, telling the peer `code` and `reason`.
    func close(code: UInt64, reason: String)
}

/// The clock of the QUIC side: the monotonic time NIO's timers use, as the engine takes it.
enum QUICClock {
    static var now: QUICTime { QUICTime(nanoseconds: NIODeadline.now().uptimeNanoseconds) }
}
