import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A UDP middlebox for tests: forwards datagrams between clients and a server, and can
/// change its outward port mid-flow (a NAT rebinding), drop everything (a vanished peer) or
/// hold every datagram a while each way (a long path). The server sees every client at one
/// address; what it sends goes to each of the latest few clients, whose QUIC endpoints keep
/// only packets of their own connections, so a client's retry from a new socket does not take
/// the answers meant for its first attempt.
///
/// Its state is behind NIO's pthread-based lock rather than `Synchronization.Mutex`: the two
/// directions run on different event-loop threads, and ThreadSanitizer sees a pthread mutex's
/// ordering but not that of the standard library's uninstrumented Mutex, which it reported as a
/// race between two accesses inside the same lock (docs/SECURITY.md, "Sanitizers").
final class UDPRelay: Sendable {
    private let inside: any Channel
    private let state: NIOLockedValueBox<State>

    private struct State {
        var server: SocketAddress
        var outside: (any Channel)?
        /// The clients heard from, the latest last.
        var clients: [SocketAddress] = []
        var dropFromClient = false
        var dropFromServer = false
        var rebinds = 0
        var delay = TimeAmount.zero
    }

    /// The port clients send to.
    var port: UInt16 { UInt16(inside.localAddress!.port!) }

    /// Room for the largest datagram: QUIC sends 65 000-byte packets to loopback addresses.
    private static let wholeDatagrams = FixedSizeRecvByteBufferAllocator(capacity: 65536)

    /// A relay to `server`, taking clients on `port` of 127.0.0.1 (0: any free one).
    static func start(to server: SocketAddress, port: UInt16 = 0) async throws -> UDPRelay {
        let box = NIOLockedValueBox<UDPRelay?>(nil)
        let inside = try await DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelOption(.recvAllocator, value: Self.wholeDatagrams)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Forwarder { envelope in
                        box.withLockedValue { $0 }?.fromClient(envelope)
                    })
                }
            }
            .bind(host: "127.0.0.1", port: Int(port)).get()
        let relay = UDPRelay(inside: inside, server: server)
        box.withLockedValue { $0 = relay }
        try await relay.rebind()
        return relay
    }

    private init(inside: any Channel, server: SocketAddress) {
        self.inside = inside
        self.state = NIOLockedValueBox(State(server: server))
    }

    /// Sends the client's datagrams to another server from now on (as if the first restarted).
    func retarget(to server: SocketAddress) { state.withLockedValue { $0.server = server } }

    /// Moves the server-facing side to a new socket (new source port), as a NAT would.
    func rebind() async throws {
        let outside = try await DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelOption(.recvAllocator, value: Self.wholeDatagrams)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Forwarder { [weak self] envelope in
                        self?.fromServer(envelope)
                    })
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let old = state.withLockedValue { state -> (any Channel)? in
            let old = state.outside
            state.outside = outside
            state.rebinds += 1
            return old
        }
        try? await old?.close()
    }

    /// Holds every datagram `oneWay` before forwarding it, both ways (a round trip of twice that).
    func delay(_ oneWay: TimeAmount) { state.withLockedValue { $0.delay = oneWay } }

    /// Drops every datagram from now on, both ways.
    func blackhole() {
        state.withLockedValue { state in
            state.dropFromClient = true
            state.dropFromServer = true
        }
    }

    /// As if the server's process exited now: nothing reaches it any more, and what it sent
    /// until now (datagrams already on their way, some still unread in this relay's socket) is
    /// forwarded for `grace` more, then nothing.
    func serverExits(inFlightFor grace: TimeAmount) {
        state.withLockedValue { $0.dropFromClient = true }
        inside.eventLoop.scheduleTask(in: grace) { self.state.withLockedValue { $0.dropFromServer = true } }
    }

    func stop() async {
        let outside = state.withLockedValue { $0.outside }
        try? await inside.close()
        try? await outside?.close()
    }

    private func fromClient(_ envelope: AddressedEnvelope<ByteBuffer>) {
        // An empty datagram holds no packet: a QUIC client's refusal watch, from a socket of its
        // own, which would otherwise count as a client and push out one that needs the answers.
        guard envelope.data.readableBytes > 0 else { return }
        let (outside, server, delay): ((any Channel)?, SocketAddress, TimeAmount) = state.withLockedValue { state in
            if state.clients.last != envelope.remoteAddress {
                state.clients.removeAll { $0 == envelope.remoteAddress }
                state.clients.append(envelope.remoteAddress)
                if state.clients.count > Self.clientsKept { state.clients.removeFirst() }
            }
            return (state.dropFromClient ? nil : state.outside, state.server, state.delay)
        }
        guard let outside else { return }
        Self.send(AddressedEnvelope(remoteAddress: server, data: envelope.data), on: outside, after: delay)
    }

    /// How many of the latest clients get what the server sends.
    private static let clientsKept = 4

    private func fromServer(_ envelope: AddressedEnvelope<ByteBuffer>) {
        let (clients, delay) = state.withLockedValue { state in (state.dropFromServer ? [] : state.clients, state.delay) }
        for client in clients {
            Self.send(AddressedEnvelope(remoteAddress: client, data: envelope.data), on: inside, after: delay)
        }
    }

    private static func send(_ envelope: AddressedEnvelope<ByteBuffer>, on channel: any Channel, after delay: TimeAmount) {
        guard delay > .zero else { return channel.writeAndFlush(envelope, promise: nil) }
        channel.eventLoop.scheduleTask(in: delay) { channel.writeAndFlush(envelope, promise: nil) }
    }

    private final class Forwarder: ChannelInboundHandler, Sendable {
        typealias InboundIn = AddressedEnvelope<ByteBuffer>
        let forward: @Sendable (AddressedEnvelope<ByteBuffer>) -> Void
        init(_ forward: @escaping @Sendable (AddressedEnvelope<ByteBuffer>) -> Void) { self.forward = forward }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) { forward(unwrapInboundIn(data)) }
    }
}
