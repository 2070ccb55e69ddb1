import NIOCore
import NIOPosix
@_spi(Stacks) import QXferCore

/// Opening and tuning the UDP sockets QUIC runs on, each with its ``QUICSocketHandler``:
/// the only place that sets a QUIC socket's options.
enum QUICSockets {
    /// What a connection's parameters ask of its sockets; a migrated or rebound socket gets the same.
    struct Options: Sendable {
        /// The DSCP byte the socket's packets carry (IP_TOS / IPV6_TCLASS); 0 leaves the default.
        var trafficClass: Int32 = 0
        /// Whether the socket pauses briefly after a small read (``ReadCoalescing``): bulk transfers only.
        var coalescesReads = false

        init() {}

        init<Stack>(_ parameters: NetworkParameters<Stack>) {
            trafficClass = parameters.serviceClass.trafficClass
            coalescesReads = parameters.performanceMode == .bulk
        }
    }

    /// Messages (datagrams or GRO batches) one `recvmmsg` reads at most.
    static let messagesPerVectorRead = 8
    /// `recvmmsg` calls per readiness of the socket, before the channel asks to read again.
    static let vectorReadsPerRead = 4
    /// The most messages the channel reads before it asks to read again.
    static var messagesPerRead: Int { messagesPerVectorRead * vectorReadsPerRead }

    /// The address a client socket binds to reach a peer of that family: any, any port.
    static func wildcardHost(ipv6: Bool) -> String { ipv6 ? "::" : "0.0.0.0" }

    /// Tunes a new QUIC socket for `options` and puts its handler on it: a listener's with
    /// `server`, a client's with nil.
    static func prepare(_ channel: any Channel, options: Options, server: QUICSocketHandler.Server?) throws {
        try tune(channel, trafficClass: options.trafficClass)
        try channel.pipeline.syncOperations.addHandler(QUICSocketHandler(server: server, coalescesReads: options.coalescesReads))
    }

    /// Socket options for a QUIC UDP socket: big buffers, GRO, vectored reads, DSCP.
    private static func tune(_ channel: any Channel, trafficClass: Int32) throws {
        guard let options = channel.syncOptions else { return }
        try options.setOption(.socketOption(.so_rcvbuf), value: 4 << 20)
        try options.setOption(.socketOption(.so_sndbuf), value: 4 << 20)
        try options.setOption(.writeBufferWaterMark, value: .init(low: 256 << 10, high: 1 << 20))
        try? options.setOption(.datagramReceiveOffload, value: true)
        try? options.setOption(.datagramReceiveSegmentSize, value: true)
        // Vectored reads (recvmmsg) of up to 8 GRO batches, 4 of them per readiness; NIO splits
        // one buffer evenly between the messages, so each needs room for a whole 64 KiB batch.
        try options.setOption(.datagramVectorReadMessageCount, value: messagesPerVectorRead)
        try options.setOption(.maxMessagesPerRead, value: UInt(vectorReadsPerRead))
        try options.setOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: messagesPerVectorRead * 65536))
        // Don't Fragment on every datagram, and the MTU the kernel learned for the path (from
        // ICMP) ignored: QUIC sizes its packets itself (RFC 9000 §14; ngtcp2's discovery,
        // ``PathMTUProbe``). By default Linux fragments a datagram above a learned MTU, and
        // fails a GSO batch whose packets are above it (EINVAL), which stalled every connection
        // on a path narrower than the local link (docs/benchmarks.md, "Datagrams as large as
        // the path carries"). An IPv4 socket refuses the IPv6 option and may refuse the other way.
        func setIP(_ level: Int32, _ name: Int32, _ value: Int32) {
            try? options.setOption(ChannelOptions.Types.SocketOption(level: SocketOptionLevel(level), name: name), value: SocketOptionValue(value))
        }
        setIP(Int32(IPPROTO_IP), IP_MTU_DISCOVER, IP_PMTUDISC_PROBE)
        setIP(Int32(IPPROTO_IPV6), IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE)
        if trafficClass != 0 {
            setIP(Int32(IPPROTO_IP), IP_TOS, trafficClass)
            setIP(Int32(IPPROTO_IPV6), IPV6_TCLASS, trafficClass)
        }
    }

    /// A client's UDP socket bound to `host` (any port) on `group`, with its QUIC handler.
    static func openClientSocket(on group: any EventLoopGroup, host: String, options: Options) async throws -> any Channel {
        // A literal address binds without getaddrinfo, which asks the kernel for every
        // interface address first (a netlink dump at the start of every connection).
        if let literal = try? SocketAddress(ipAddress: host, port: 0) {
            return try await bindClientSocket(on: group, to: literal, options: options).get()
        }
        return try await bindClientSocket(on: group, host: host, port: 0, options: options).get()
    }

    /// A client's UDP socket bound to `host` and `port`, with its QUIC handler.
    static func bindClientSocket(on group: any EventLoopGroup, host: String, port: Int, options: Options) -> EventLoopFuture<any Channel> {
        clientBootstrap(on: group, options: options).bind(host: host, port: port)
    }

    /// A client's UDP socket bound to `address` (a socket that died, taken again), with its QUIC handler.
    static func bindClientSocket(on group: any EventLoopGroup, to address: SocketAddress, options: Options) -> EventLoopFuture<any Channel> {
        clientBootstrap(on: group, options: options).bind(to: address)
    }

    private static func clientBootstrap(on group: any EventLoopGroup, options: Options) -> DatagramBootstrap {
        DatagramBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try prepare(channel, options: options, server: nil)
                }
            }
    }
}

#if canImport(Glibc)
import Glibc
#endif
