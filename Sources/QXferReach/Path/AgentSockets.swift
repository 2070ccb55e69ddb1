import NIOCore

// The path agent's local sockets and its channel handlers: thin, every decision is AgentCore's.

/// A local UDP socket written from the peer's datagrams and flushed once per batch.
protocol LocalSocket: AnyObject {
    var flushPending: Bool { get set }
    /// Writes (without flushing) `bytes`: one datagram, or `segmentSize` ones, to `address`
    /// (nil on a connected socket).
    func write(_ bytes: ByteBuffer, to address: SocketAddress?, segmentSize: Int?)
    func flushChannel()
}

/// Where a batch for the peer goes: the route's address when it is written (one target).
struct PeerTarget: Equatable {}

/// Where a batch for this host goes: a local socket, and the flow's address on an offer side's.
struct LocalTarget: Equatable {
    let socket: any LocalSocket
    let address: SocketAddress?

    static func == (lhs: LocalTarget, rhs: LocalTarget) -> Bool {
        lhs.socket === rhs.socket && lhs.address == rhs.address
    }
}

/// Offer side: one service's local port (UDP and TCP) and its flows.
final class OfferFront: LocalSocket {
    let port: UInt16
    var udp: (any Channel)?
    var tcp: (any Channel)?
    var flows = OfferFlows<SocketAddress>()
    var flushPending = false
    var reopening = false

    init(port: UInt16, udp: any Channel, tcp: any Channel) {
        self.port = port
        self.udp = udp
        self.tcp = tcp
    }

    func write(_ bytes: ByteBuffer, to address: SocketAddress?, segmentSize: Int?) {
        guard let udp, let address else { return }
        udp.write(AddressedEnvelope(remoteAddress: address, data: bytes, metadata: AgentCore.metadata(segmentSize)), promise: nil)
    }

    func flushChannel() { udp?.flush() }
}

/// Answer side: one flow's UDP socket toward the local service.
final class FlowSocket: LocalSocket {
    let key: FlowKey
    var channel: (any Channel)?
    /// Datagrams that arrived while the socket was opening (bounded).
    var pending: [ByteBuffer] = []
    var flushPending = false
    var closed = false

    init(key: FlowKey) { self.key = key }

    func write(_ bytes: ByteBuffer, to address: SocketAddress?, segmentSize: Int?) {
        guard let channel else { return }
        if let segmentSize, let remote = channel.remoteAddress {
            channel.write(AddressedEnvelope(remoteAddress: remote, data: bytes, metadata: AgentCore.metadata(segmentSize)), promise: nil)
        } else {
            channel.write(bytes, promise: nil)
        }
    }

    func flushChannel() { channel?.flush() }
}

// MARK: - Handlers: thin, everything is the core's

final class WideSocketHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    private let core: AgentCore
    init(core: AgentCore) { self.core = core }
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { core.wideRead(unwrapInboundIn(data)) }
    func channelReadComplete(context: ChannelHandlerContext) { core.flushToLocal() }
    func channelInactive(context: ChannelHandlerContext) { core.wideClosed(context.channel) }
    // Errors NIO does not close the socket for (a refused send's ICMP) change nothing.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {}
}

final class FrontSocketHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    private let core: AgentCore
    private let service: UInt8
    init(core: AgentCore, service: UInt8) {
        self.core = core
        self.service = service
    }
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { core.frontRead(service, unwrapInboundIn(data)) }
    func channelReadComplete(context: ChannelHandlerContext) { core.flushToPeer() }
    func channelInactive(context: ChannelHandlerContext) { core.frontClosed(service, context.channel) }
    func errorCaught(context: ChannelHandlerContext, error: any Error) {}
}

final class FlowSocketHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    private let core: AgentCore
    private let socket: FlowSocket
    init(core: AgentCore, socket: FlowSocket) {
        self.core = core
        self.socket = socket
    }
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { core.flowRead(socket, unwrapInboundIn(data)) }
    func channelReadComplete(context: ChannelHandlerContext) { core.flushToPeer() }
    func channelInactive(context: ChannelHandlerContext) { core.flowClosed(socket) }
    func errorCaught(context: ChannelHandlerContext, error: any Error) {}
}
