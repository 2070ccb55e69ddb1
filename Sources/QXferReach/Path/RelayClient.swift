import FoundationEssentials
import PlainText
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// What a relay said in `welcome` (docs/PROTOCOL.md §9.2).
struct RelayWelcome: Sendable, Equatable {
    /// This client's address and port as the relay sees them.
    var observed: String
    /// This client's seat: what its binds and splices carry.
    var bindToken: [UInt8]
    /// Seconds the room waits for its second side.
    var expiresIn: Int
}

/// What the control connection reports after `welcome`.
enum RelayEvent: Equatable {
    /// Both sides are present.
    case paired
    /// A peer's signal, its bytes as the peer sent them.
    case signal([UInt8])
    /// The peer's control connection ended.
    case peerGone
    /// The control connection ended (refused, broken, closed); nothing follows.
    case ended(ReachError)
}

/// The client's side of a relay's control connection (docs/PROTOCOL.md §9.2) and of its splices
/// (§9.4). Lives on one event loop: every method is called there.
final class RelayClient {
    /// The most signals a side may send, and the most a client takes from its peer.
    static let maximumSignals = 64
    /// Events kept for a consumer not yet listening; a relay that sends more breaks the protocol
    /// (it carries at most 64 signals and a few other messages).
    static let maximumBufferedEvents = 80

    let relay: RelayAddress
    let eventLoop: any EventLoop
    private(set) var channel: (any Channel)?
    /// The address the control connection reached: the relay's UDP port and splices are there too.
    private(set) var relaySocketAddress: SocketAddress?
    private(set) var welcome: RelayWelcome?
    private(set) var isPaired = false
    private(set) var signalsSent = 0
    private var signalsReceived = 0
    private var ended: ReachError?
    private var welcomePromise: EventLoopPromise<RelayWelcome>?
    private var buffered: [RelayEvent] = []
    /// Where events go; set once, on the loop. Events before it are kept (bounded).
    var onEvent: ((RelayEvent) -> Void)? {
        didSet {
            guard let onEvent else { return }
            let pending = buffered
            buffered = []
            for event in pending { onEvent(event) }
        }
    }

    private init(relay: RelayAddress, eventLoop: any EventLoop) {
        self.relay = relay
        self.eventLoop = eventLoop
    }

    /// Connects to `relay`, says hello for `room` as `side` and completes after `welcome`, or
    /// fails with a ``ReachError`` (a refusal mapped to its kind, the relay unreachable, silent
    /// for `timeout`, or breaking the protocol). Call on `eventLoop`.
    static func connect(to relay: RelayAddress, room: [UInt8], side: RoomSide, on eventLoop: any EventLoop,
                        timeout: Duration) -> EventLoopFuture<RelayClient> {
        eventLoop.preconditionInEventLoop()
        guard room.count == 32 else {
            return eventLoop.makeFailedFuture(ReachError(.local, "a room is 32 bytes, not \(room.count)"))
        }
        let hello: [UInt8]
        do {
            hello = try RelayMessage.hello(version: RelayMessage.version, room: TextFormat.hex(room), side: side).framed()
        } catch {
            return eventLoop.makeFailedFuture(ReachError(.local, "cannot encode hello: \(error)"))
        }
        let client = RelayClient(relay: relay, eventLoop: eventLoop)
        let promise = eventLoop.makePromise(of: RelayWelcome.self)
        client.welcomePromise = promise
        let bound = NIOLoopBound(client, eventLoop: eventLoop)
        let connecting = ClientBootstrap(group: eventLoop)
            .connectTimeout(TimeAmount(timeout))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RelayControlHandler(client: bound.value))
                }
            }
            .connect(host: relay.host, port: Int(relay.port))
        let timer = eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(timeout)) {
            client.end(ReachError(.timedOut, "the relay \(relay) did not answer within \(timeout.components.seconds) s"))
        }
        connecting.assumeIsolated().whenComplete { result in
            switch result {
            case .success(let channel):
                client.channel = channel
                client.relaySocketAddress = channel.remoteAddress
                if client.ended != nil {
                    channel.close(promise: nil)
                    return
                }
                channel.writeAndFlush(ByteBuffer(bytes: hello), promise: nil)
            case .failure(let error):
                client.end(ReachError(.relayUnreachable, "cannot reach the relay \(relay): \(describe(error))"))
            }
        }
        return promise.futureResult.assumeIsolated().map { _ in
            timer.cancel()
            return client
        }.nonisolated()
    }

    /// Sends `data` to the peer as a `signal`; false if it cannot go (too large, the 64 used, the
    /// connection gone, not yet paired).
    @discardableResult
    func send(signal data: [UInt8]) -> Bool {
        guard ended == nil, isPaired, let channel, signalsSent < Self.maximumSignals, data.count <= RelayMessage.maximumSignalSize,
              let framed = try? RelayMessage.signal(data: Data(data)).framed() else { return false }
        signalsSent += 1
        channel.writeAndFlush(ByteBuffer(bytes: framed), promise: nil)
        return true
    }

    /// Signals this side may still send.
    var signalsLeft: Int { ended == nil ? Self.maximumSignals - signalsSent : 0 }

    /// Whether the control connection still runs.
    var isOpen: Bool { ended == nil }

    /// Closes the control connection.
    func close() {
        end(ReachError(.local, "the control connection was closed"))
    }

    // MARK: - From the handler

    fileprivate func received(_ message: RelayMessage) {
        guard ended == nil else { return }
        switch message {
        case .welcome(let observed, let token, let expiresIn) where welcome == nil:
            let welcome = RelayWelcome(observed: observed, bindToken: Array(token), expiresIn: expiresIn)
            self.welcome = welcome
            welcomePromise?.succeed(welcome)
            welcomePromise = nil
        case .refused(let reason):
            end(Self.refusal(reason))
        case .paired where welcome != nil && !isPaired:
            isPaired = true
            emit(.paired)
        case .signal(let data) where isPaired:
            signalsReceived += 1
            guard signalsReceived <= Self.maximumSignals else {
                return end(ReachError(.protocolViolation, "the relay carried more than \(Self.maximumSignals) signals from the peer"))
            }
            emit(.signal(Array(data)))
        case .peerGone where welcome != nil:
            emit(.peerGone)
        default:
            end(ReachError(.protocolViolation, "the relay \(relay) sent a message out of turn"))
        }
    }

    fileprivate func end(_ error: ReachError) {
        guard ended == nil else { return }
        ended = error
        welcomePromise?.fail(error)
        welcomePromise = nil
        channel?.close(promise: nil)
        emit(.ended(error))
    }

    private func emit(_ event: RelayEvent) {
        if let onEvent { return onEvent(event) }
        guard buffered.count < Self.maximumBufferedEvents else {
            return end(ReachError(.protocolViolation, "the relay \(relay) sent too many messages"))
        }
        buffered.append(event)
    }

    // MARK: - Words

    /// A `refused` reason as the error it stands for (the sentences of §9.2), the relay's own
    /// words kept for the others.
    static func refusal(_ reason: String) -> ReachError {
        let shown = printable(reason)
        let lowered = shown.lowercased()
        if lowered.contains("room taken") { return ReachError(.roomTaken, "room taken: another sender holds this code's room") }
        if lowered.contains("no sender is waiting") { return ReachError(.noSuchCode, "no sender is waiting with this code") }
        if lowered.contains("already used") { return ReachError(.codeUsed, "this code was already used") }
        if lowered.contains("nobody came") { return ReachError(.timedOut, "nobody came with this code in time") }
        return ReachError(.refusedByRelay, "the relay refused: \(shown)")
    }

    /// A hostile relay's sentence made safe to print: no control characters, at most 200 characters.
    static func printable(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.lazy.filter { !$0.properties.generalCategory.isControl }.prefix(200)))
    }


    /// A socket error as a user reads it ("Connection refused", "timed out").
    static func describe(_ error: any Error) -> String {
        if let error = error as? ReachError { return error.description }
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        if error is SocketAddressError.UnknownHost { return "the name does not resolve" }
        if let connect = error as? NIOConnectionError {
            if let first = connect.connectionErrors.first { return describe(first.error) }
            if connect.dnsAAAAError != nil || connect.dnsAError != nil { return "the name does not resolve" }
            return "no address to connect to"
        }
        if let channel = error as? ChannelError {
            switch channel {
            case .connectTimeout: return "timed out"
            case .ioOnClosedChannel, .alreadyClosed, .eof: return "the connection is closed"
            default: return "\(channel)"
            }
        }
        return "\(error)"
    }
}

extension Unicode.GeneralCategory {
    fileprivate var isControl: Bool {
        switch self {
        case .control, .format, .lineSeparator, .paragraphSeparator, .unassigned, .surrogate, .privateUse: true
        default: false
        }
    }
}

/// Decodes the control connection's messages for its ``RelayClient``.
private final class RelayControlHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private let client: RelayClient
    private var decoder = RelayMessageDecoder()

    init(client: RelayClient) { self.client = client }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        let messages: [RelayMessage]
        do { messages = try decoder.feed(buffer.readableBytesView) } catch {
            return client.end(ReachError(.protocolViolation, "the relay \(client.relay) broke the protocol: \(error)"))
        }
        for message in messages { client.received(message) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        client.end(ReachError(.relayUnreachable, "the relay \(client.relay) closed the connection"))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        client.end(ReachError(.relayUnreachable, "the connection to the relay \(client.relay) failed: \(RelayClient.describe(error))"))
    }
}

// MARK: - Splices

/// Opening a splice (docs/PROTOCOL.md §9.4): a TCP connection to the relay whose first message
/// names the seat and the splice's id; `spliced` makes it a plain byte pipe to the peer.
enum RelaySplice {
    /// How long a splice may wait for `spliced` (the relay waits 10 s for the peer's).
    static let patience: TimeAmount = .seconds(15)

    /// Connects to the relay at `relay`, asks for splice `id` of the seat `bindToken`, and
    /// completes with the channel once `spliced` arrives. The channel does not read by itself
    /// (auto-read off) and still has its ``SpliceHandshakeHandler``, which holds the peer's first
    /// bytes until ``SplicePipe/join(_:_:counting:)``. Call on `eventLoop`.
    static func open(relay: SocketAddress, bindToken: [UInt8], id: Int, on eventLoop: any EventLoop) -> EventLoopFuture<any Channel> {
        let request: [UInt8]
        do { request = try RelayMessage.splice(bindToken: Data(bindToken), id: id).validated().framed() } catch {
            return eventLoop.makeFailedFuture(ReachError(.local, "cannot encode a splice request: \(error)"))
        }
        let spliced = eventLoop.makePromise(of: Void.self)
        let connecting = ClientBootstrap(group: eventLoop)
            .connectTimeout(.seconds(5))
            .channelOption(.autoRead, value: false)
            .channelOption(.allowRemoteHalfClosure, value: true)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(SpliceHandshakeHandler(request: request, spliced: spliced))
                }
            }
            .connect(to: relay)
        connecting.whenFailure { spliced.fail($0) }
        let timer = eventLoop.scheduleTask(in: patience) {
            spliced.fail(ReachError(.timedOut, "the relay did not join splice \(id) in time"))
        }
        return connecting.flatMap { channel in
            spliced.futureResult.map { _ in
                timer.cancel()
                return channel
            }.flatMapError { error in
                timer.cancel()
                channel.close(promise: nil)
                return channel.eventLoop.makeFailedFuture(error)
            }
        }
    }
}

/// The first exchange of a splice connection: writes the request, reads `spliced` (one message,
/// exactly its bytes: what follows is the peer's), then holds the peer's first bytes until the
/// pipe takes them.
final class SpliceHandshakeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let request: [UInt8]
    private let spliced: EventLoopPromise<Void>
    private var pending = ByteBuffer()
    private var isSpliced = false
    private var failed = false

    init(request: [UInt8], spliced: EventLoopPromise<Void>) {
        self.request = request
        self.spliced = spliced
    }

    func channelActive(context: ChannelHandlerContext) {
        context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: request)), promise: nil)
        context.read()
        context.fireChannelActive()
    }

    typealias OutboundOut = ByteBuffer

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        pending.writeBuffer(&buffer)
        guard !isSpliced, !failed else { return }
        // One framed message: its 4-byte length, then the body; the rest is the peer's data.
        guard let length = pending.getInteger(at: pending.readerIndex, as: UInt32.self) else { return }
        guard length <= RelayMessage.maximumSize else { return fail(context, "an oversized message on a splice") }
        guard pending.readableBytes >= 4 + Int(length), let frame = pending.readBytes(length: 4 + Int(length)) else { return }
        var decoder = RelayMessageDecoder()
        guard let messages = try? decoder.feed(frame), messages == [.spliced] else {
            return fail(context, "the relay answered a splice with something other than spliced")
        }
        isSpliced = true
        spliced.succeed()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // Auto-read is off: read on only until `spliced`; the pipe reads after that.
        if !isSpliced, !failed { context.read() }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !isSpliced { spliced.fail(ReachError(.relayUnreachable, "the relay closed a splice before joining it")) }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !isSpliced { fail(context, "a splice failed: \(RelayClient.describe(error))") } else { context.fireErrorCaught(error) }
    }

    /// Hands the peer's bytes held so far to the next handler and leaves the pipeline.
    func release(context: ChannelHandlerContext) {
        if pending.readableBytes > 0 {
            let held = pending
            pending = ByteBuffer()
            context.fireChannelRead(wrapInboundOut(held))
            context.fireChannelReadComplete()
        }
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    private func fail(_ context: ChannelHandlerContext, _ reason: String) {
        failed = true
        spliced.fail(ReachError(.protocolViolation, reason))
        context.close(promise: nil)
    }
}
