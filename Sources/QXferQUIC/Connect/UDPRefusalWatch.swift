import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// While a client's handshake waits: whether the server's host refuses UDP on the port (an
/// ICMP port unreachable: nothing listens there, or a firewall rejects), so that the attempt
/// fails at once, as a refused TCP connection does, instead of at the handshake timeout.
///
/// The QUIC socket never hears it: Linux reports ICMP errors only to a connected UDP socket,
/// and the client's socket stays unconnected so that its packets follow the host to a new
/// address (a connected socket keeps the source address it connected with). So a connected
/// socket of its own sends a few empty datagrams to the same port, which a QUIC endpoint
/// drops unread (they hold no packet), and reports the first refusal. The datagrams repeat a
/// few times: an ICMP answer may be lost, or held back by the host's ICMP rate limit.
final class UDPRefusalWatch: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>

    /// When the empty datagrams leave, counted from the start of the watch.
    static let sendTimes: [TimeAmount] = [.zero, .milliseconds(250), .seconds(1), .seconds(3)]

    /// The errors that mean nobody on that host takes UDP on the port, or the host is not reachable.
    static let refusals: Set<Int32> = [ECONNREFUSED, EHOSTUNREACH, ENETUNREACH]

    private let refused: (Int32) -> Void
    private var reported = false

    private init(refused: @escaping (Int32) -> Void) {
        self.refused = refused
    }

    /// Watches `remote` from a socket on `loop` until `done` completes, sending only while
    /// `unanswered` (called on `loop`) holds; `refused` is called on `loop` at most once, with the
    /// errno of the first refusal. Nothing is reported if the watch cannot open its socket: the
    /// handshake's own timeout still ends the attempt.
    static func watch<Done: Sendable>(
        _ remote: SocketAddress, on loop: any EventLoop, until done: EventLoopFuture<Done>,
        unanswered: @escaping @Sendable () -> Bool, refused: @escaping @Sendable (Int32) -> Void
    ) {
        // The socket's channel lives on `loop`, as the handler does.
        let watch = NIOLoopBound(UDPRefusalWatch(refused: refused), eventLoop: loop)
        let opened = DatagramBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(watch.value) }
            }
            .connect(to: remote)
        opened.whenSuccess { channel in
            let sends = sendTimes.map { delay in
                loop.scheduleTask(in: delay) {
                    guard unanswered() else { return }
                    // A send refused for an earlier datagram's ICMP answer fails here (and
                    // closes the channel), not in `errorCaught`.
                    channel.writeAndFlush(ByteBuffer()).whenFailure { watch.value.report($0) }
                }
            }
            done.whenComplete { _ in
                for send in sends { send.cancel() }
                channel.close(promise: nil)
            }
        }
    }

    /// An ICMP answer to an earlier datagram, as the socket's pending error.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        report(error)
    }

    private func report(_ error: any Error) {
        guard !reported, let code = (error as? IOError)?.errnoCode, Self.refusals.contains(code) else { return }
        reported = true
        refused(code)
    }
}
