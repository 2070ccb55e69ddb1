import NIOCore
import NIOPosix
import NIOSSL
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity
@_spi(Stacks) import QXferSockets

/// The wire format of TCP+TLS child connections: how QUIC's extra streams and datagrams
/// degrade on a stack that has one ordered byte stream per connection (docs/PROTOCOL.md §8).
///
/// Each extra stream, and the one carrier of a connection's datagrams, is a TCP+TLS connection
/// of its own to the same listener, with ALPN ``alpn``. Its first bytes name the parent
/// connection by a token both ends derive from the parent's TLS exporter, so nothing is added
/// to the parent's own byte stream (a plain TLS client with ALPN `qxfer/1` sees no change).
enum TLSChildProtocol {
    /// The ALPN of child connections.
    static let alpn = "qxfer/1-stream"
    /// Exporter label of the parent's token (RFC 8446 section 7.5, empty context).
    static let tokenLabel = "EXPORTER-qxfer-stream-token"
    /// Bytes of the token.
    static let tokenLength = 16
    /// The hello a child sends first: the token, then its kind.
    static let helloLength = tokenLength + 1

    /// What a child connection carries.
    enum Kind: UInt8 {
        /// One extra bidirectional stream.
        case stream = 0
        /// The parent's datagrams, each as a 2-byte big-endian length and the payload.
        case datagrams = 1
    }

    /// The listener's one-byte answer to a hello.
    enum Status: UInt8 {
        case accepted = 0
        /// No open connection has this token (closed, or never existed).
        case unknownConnection = 1
        /// The connection refuses it: a second datagram carrier, too many streams waiting, or a
        /// client certificate other than the parent's.
        case refused = 2
    }

    /// The largest datagram payload: what every QUIC path carries (RFC 9000 section 14), so an
    /// application's datagrams fit on both stacks.
    static let maximumDatagramSize = 1200
    /// Streams of one parent open at once; more wait for one to close (QUIC's default credit).
    static let maximumStreams = 128
    /// Streams of one parent waiting for admission; more are refused.
    static let maximumWaitingStreams = 128
    /// Received datagrams kept for a reader that falls behind; older ones are dropped (as on QUIC).
    static let incomingDatagramLimit = 256
}

/// How a client reaches its server again for child connections.
final class TLSChildConnector: Sendable {
    /// The parent's remote address: the very server, not another address of its name.
    let address: SocketAddress
    let identity: HostIdentity
    let tls: TLS
    let settings: SocketTuning.Settings
    let idle: Duration?
    /// Who the parent's server is: a child must reach the same certificate.
    let serverPeer: PeerIdentity
    let timeout: Duration
    /// The children's TLS context, made on first use and shared: loading the key per stream
    /// would cost more than the handshake.
    private let context = Locked<NIOSSLContext?>(nil)

    init(
        address: SocketAddress, identity: HostIdentity, tls: TLS, settings: SocketTuning.Settings, idle: Duration?,
        serverPeer: PeerIdentity, timeout: Duration
    ) {
        self.address = address
        self.identity = identity
        self.tls = tls
        self.settings = settings
        self.idle = idle
        self.serverPeer = serverPeer
        self.timeout = timeout
    }

    private func childContext() throws -> NIOSSLContext {
        if let context = context.withLock({ $0 }) { return context }
        var childTLS = tls
        childTLS.applicationProtocols = [TLSChildProtocol.alpn]
        let made = try TLSByteStream.makeContext(identity: identity, tls: childTLS, role: .client, exporterSecrets: nil)
        context.withLock { $0 = made }
        return made
    }

    /// Connects a child of the connection named `token`, says what it carries, and waits for
    /// the listener to admit it (which it delays while the parent's stream limit is reached).
    /// `register` is called as soon as the child exists, so closing the parent closes it.
    func connect(kind: TLSChildProtocol.Kind, token: [UInt8], register: @Sendable (TLSByteStream) throws -> Void) async throws -> TLSByteStream {
        guard let fingerprint = serverPeer.fingerprint else {
            throw QXferError(.unsupported, "the server presented no certificate to bind extra streams to")
        }
        let context = try childContext()
        let verifier = PeerVerifier(.client(.pinned(fingerprint), hostKey: "\(address)"))
        let settings = self.settings, idle = self.idle
        let setup: TLSByteStream.Setup
        do {
            setup = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(TimeAmount(timeout))
                .channelOption(.allowRemoteHalfClosure, value: true)
                .connect(to: address) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        SocketTuning.apply(settings, to: channel)
                        let tlsHandler = try NIOSSLClientHandler(
                            context: context, serverHostname: nil, customVerificationCallback: verifier.verify)
                        return try TLSByteStream.Setup.install(
                            tlsHandler, accepting: [TLSChildProtocol.alpn], idle: idle, exporterSecrets: nil, on: channel)
                    }
                }
        } catch {
            throw QXferError(.connectFailed, "cannot open a stream to \(address): \(ChannelErrors.reason(error))", underlying: error)
        }
        let handshaken = try await setup.finishHandshake(verifier: verifier, peerName: "\(address)", timeout: timeout)
        // The child speaks for the parent: report the parent's peer, as a QUIC stream does.
        let child = TLSByteStream(channel: handshaken.channel, bridge: handshaken.bridge, peer: serverPeer, exporter: nil)
        do {
            try register(child)
            var hello = ByteBuffer(bytes: token)
            hello.writeInteger(kind.rawValue)
            // The answer may be held back for long (the parent's stream limit): cancelling the
            // caller's task gives up on the child.
            let status: UInt8? = try await withTaskCancellationHandler {
                try await child.write(hello)
                var status: UInt8?
                while status == nil {
                    guard var received = try await child.read() else { break }
                    status = received[0].readInteger(as: UInt8.self)
                    let bridge = child.bridge
                    let unread = received
                    try await child.channel.eventLoop.submit { bridge.value.pushBack(unread) }.get()
                }
                try Task.checkCancellation()
                return status
            } onCancel: {
                child.close()
            }
            switch status.flatMap(TLSChildProtocol.Status.init(rawValue:)) {
            case .accepted?:
                return child
            case .unknownConnection?:
                throw QXferError(.connectionClosed, "the peer no longer knows this connection: it has closed")
            case .refused?:
                throw QXferError(.connectionClosed, "the peer refused another \(kind == .stream ? "stream" : "datagram carrier") on this connection")
            case nil:
                throw QXferError(.connectionClosed, "the peer closed the new stream before admitting it")
            }
        } catch {
            child.close()
            if error is CancellationError || Task.isCancelled {
                throw QXferError(.cancelled, "opening the \(kind == .stream ? "stream" : "datagram carrier") was cancelled")
            }
            throw error
        }
    }
}

/// The parent connections of one TLS listener, by token, so child connections find theirs.
///
/// A client opens a child as soon as its own handshake is done, which can be before the
/// listener's task for the parent has run (a loaded machine starves it): a child whose token is
/// not known yet waits while any accepted connection is still unsettled (in its handshake, or
/// not yet registered as a parent), and is refused as unknown only once none is.
final class TLSSessionRegistry: Sendable {
    private struct State {
        var sessions: [[UInt8]: TLSStreamMultiplexer] = [:]
        /// Accepted connections not yet known to be a parent (registered) or not one.
        var unsettled = 0
        var nextWaiter = 0
        var waiters: [Int: (token: [UInt8], continuation: CheckedContinuation<TLSStreamMultiplexer?, Never>)] = [:]
    }

    private let state = Locked(State())

    /// An accepted connection starts its handshake; ``settled()`` must follow once.
    func accepted() {
        state.withLock { $0.unsettled += 1 }
    }

    /// The connection counted by ``accepted()`` is now a registered parent, a child, or gone.
    func settled() {
        let released = state.withLock { state -> [CheckedContinuation<TLSStreamMultiplexer?, Never>] in
            state.unsettled -= 1
            guard state.unsettled == 0 else { return [] }
            defer { state.waiters = [:] }
            return state.waiters.values.map(\.continuation)
        }
        for waiter in released { waiter.resume(returning: nil) }
    }

    func register(_ session: TLSStreamMultiplexer) {
        let found = state.withLock { state -> [CheckedContinuation<TLSStreamMultiplexer?, Never>] in
            state.sessions[session.token] = session
            let ids = state.waiters.filter { $0.value.token == session.token }.map(\.key)
            return ids.compactMap { state.waiters.removeValue(forKey: $0)?.continuation }
        }
        for waiter in found { waiter.resume(returning: session) }
    }

    func remove(_ session: TLSStreamMultiplexer) {
        state.withLock { state in
            if state.sessions[session.token] === session { state.sessions.removeValue(forKey: session.token) }
        }
    }

    /// The session of `token`: at once if known, nil at once if no connection is unsettled,
    /// otherwise once one registers it, none is left unsettled, or `timeout` passes.
    func session(for token: [UInt8], on eventLoop: any EventLoop, timeout: Duration) async -> TLSStreamMultiplexer? {
        await withCheckedContinuation { continuation in
            let outcome = state.withLock { state -> (answer: TLSStreamMultiplexer?, waiting: Int?) in
                if let session = state.sessions[token] { return (session, nil) }
                guard state.unsettled > 0 else { return (nil, nil) }
                let id = state.nextWaiter
                state.nextWaiter += 1
                state.waiters[id] = (token, continuation)
                return (nil, id)
            }
            guard let id = outcome.waiting else { return continuation.resume(returning: outcome.answer) }
            eventLoop.scheduleTask(in: TimeAmount(timeout)) { [self] in
                state.withLock { $0.waiters.removeValue(forKey: id) }?.continuation.resume(returning: nil)
            }
        }
    }

    /// Reads a child's hello and hands the child to its parent, or refuses it. Returns once the
    /// child is admitted or refused; the admitted child then belongs to the parent's session.
    func admit(_ child: TLSByteStream, timeout: Duration) async {
        let deadline = ContinuousClock.now + timeout
        let timer = child.channel.eventLoop.scheduleTask(in: TimeAmount(timeout)) { [channel = child.channel] in
            channel.close(promise: nil)
        }
        var hello = ByteBuffer()
        do {
            while hello.readableBytes < TLSChildProtocol.helloLength {
                guard let received = try await child.read() else { break }
                for var buffer in received { hello.writeBuffer(&buffer) }
            }
        } catch {
            timer.cancel()
            child.close()
            return
        }
        // The client sends nothing after its hello until it is admitted: more is not our protocol.
        guard hello.readableBytes == TLSChildProtocol.helloLength,
              let token = hello.readBytes(length: TLSChildProtocol.tokenLength),
              let kind = hello.readInteger(as: UInt8.self).flatMap(TLSChildProtocol.Kind.init(rawValue:)) else {
            timer.cancel()
            child.close()
            return
        }
        let session = await session(for: token, on: child.channel.eventLoop, timeout: deadline - ContinuousClock.now)
        timer.cancel()
        guard let session else {
            await Self.answer(child, .unknownConnection)
            return
        }
        // The token proves the client took part in the parent's handshake; the certificate must
        // be the parent's too, so an allow-list decision made once holds for every child.
        guard child.peer.fingerprint == session.peer.fingerprint else {
            await Self.answer(child, .refused)
            return
        }
        // The child speaks for the parent: the application sees the parent's peer, as on QUIC.
        let adopted = TLSByteStream(channel: child.channel, bridge: child.bridge, peer: session.peer, exporter: nil)
        let status = await session.admit(adopted, kind: kind)
        if status != .accepted { await Self.answer(adopted, status) }
    }

    /// Refuses a child: one status byte, then close.
    private static func answer(_ child: TLSByteStream, _ status: TLSChildProtocol.Status) async {
        try? await child.write(ByteBuffer(bytes: [status.rawValue]))
        child.close()
    }
}

/// The streams and datagrams of one TCP+TLS connection, carried by child connections.
///
/// Only the client opens child connections (it can reach the listener; the listener cannot
/// reach it): on the listener's side `openStream()` is unsupported and datagrams sent before
/// the client opened its datagram carrier are dropped, as an unreliable datagram may be.
/// Closing the parent closes every child.
final class TLSStreamMultiplexer: StreamMultiplexer {
    enum Role: Sendable {
        case client(TLSChildConnector)
        case server(TLSSessionRegistry)
    }

    let role: Role
    /// Names the parent to its children: an exporter value of the parent connection.
    let token: [UInt8]
    /// The parent's peer; every child must present the same certificate.
    let peer: PeerIdentity
    private let inbox = DatagramInbox()
    private let state = Locked(State())

    private struct State {
        var closed = false
        /// The parent connection's channel, until the session closes.
        var parent: (any Channel)?
        /// The peer ended the parent's byte stream: finished or closed, which TCP+TLS cannot
        /// tell apart. It opens no more streams then.
        var peerFinished = false
        var children: [ObjectIdentifier: TLSByteStream] = [:]
        /// Listener: admitted streams the application has not accepted yet.
        var incoming: [TLSByteStream] = []
        var acceptWaiters: [CheckedContinuation<(any ByteStreamTransport)?, Never>] = []
        /// Listener: streams admitted and not yet closed, and those waiting for a slot.
        var openStreams = Set<ObjectIdentifier>()
        var waitingStreams: [(ObjectIdentifier, CheckedContinuation<Bool, Never>)] = []
        var datagrams: DatagramCarrier = .none
    }

    private enum DatagramCarrier {
        case none
        case connecting([CheckedContinuation<TLSByteStream, any Error>])
        case ready(TLSByteStream)
        case failed(QXferError)
    }

    init(client connector: TLSChildConnector, token: [UInt8], peer: PeerIdentity) {
        self.role = .client(connector)
        self.token = token
        self.peer = peer
    }

    init(server registry: TLSSessionRegistry, token: [UInt8], peer: PeerIdentity) {
        self.role = .server(registry)
        self.token = token
        self.peer = peer
        registry.register(self)
    }

    /// The token of `parent`, as both of its ends compute it.
    static func token(of parent: TLSByteStream) throws -> [UInt8] {
        try parent.tlsExporter(label: TLSChildProtocol.tokenLabel, context: [], length: TLSChildProtocol.tokenLength)
    }

    // MARK: Closing

    /// Closes every child and ends every wait; idempotent.
    func close() {
        let (children, acceptWaiters, slotWaiters, carrierWaiters): (
            [TLSByteStream], [CheckedContinuation<(any ByteStreamTransport)?, Never>],
            [CheckedContinuation<Bool, Never>], [CheckedContinuation<TLSByteStream, any Error>]
        ) = state.withLock { state in
            guard !state.closed else { return ([], [], [], []) }
            state.closed = true
            state.parent = nil
            var carrierWaiters: [CheckedContinuation<TLSByteStream, any Error>] = []
            if case .connecting(let waiters) = state.datagrams { carrierWaiters = waiters }
            state.datagrams = .failed(QXferError(.cancelled, "the connection was closed"))
            defer {
                state.children = [:]
                state.incoming = []
                state.acceptWaiters = []
                state.waitingStreams = []
            }
            return (Array(state.children.values), state.acceptWaiters, state.waitingStreams.map(\.1), carrierWaiters)
        }
        if case .server(let registry) = role { registry.remove(self) }
        for child in children { child.close() }
        for waiter in acceptWaiters { waiter.resume(returning: nil) }
        for waiter in slotWaiters { waiter.resume(returning: false) }
        for waiter in carrierWaiters { waiter.resume(throwing: QXferError(.cancelled, "the connection was closed")) }
        inbox.finish()
    }

    var isClosed: Bool { state.withLock { $0.closed } }

    /// Records the parent's channel, so that closing the session from any of its streams
    /// (`close(errorCode:reason:)`) closes the whole connection, as on QUIC.
    func attach(parent channel: any Channel) {
        let closed = state.withLock { state in
            if !state.closed { state.parent = channel }
            return state.closed
        }
        if closed { channel.close(promise: nil) }
    }

    /// The peer's side of the parent ended. A listener cannot tell a client's close from its
    /// `finish()` (both are close_notify and FIN), so it takes no more streams from it and
    /// ends `incomingStreams` once the admitted ones are taken; open children live on.
    func peerFinished() {
        let waiters: [CheckedContinuation<(any ByteStreamTransport)?, Never>] = state.withLock { state in
            state.peerFinished = true
            guard state.incoming.isEmpty else { return [] }
            defer { state.acceptWaiters = [] }
            return state.acceptWaiters
        }
        for waiter in waiters { waiter.resume(returning: nil) }
    }

    /// The children not closed yet.
    var openChildren: [TLSByteStream] { state.withLock { Array($0.children.values) } }

    /// Records a child so that closing the parent closes it; a child of a closed parent is refused.
    private func register(_ child: TLSByteStream) throws {
        let id = ObjectIdentifier(child)
        let added = state.withLock { state in
            guard !state.closed else { return false }
            state.children[id] = child
            return true
        }
        guard added else { throw QXferError(.cancelled, "the connection was closed") }
        child.join(self)
        child.channel.closeFuture.whenComplete { [weak self] _ in self?.childClosed(id) }
    }

    /// Frees what a closed child held: its stream slot (admitting the next waiting stream), or
    /// its place in the queue, or the datagram carrier (whose end the inbox hears itself).
    private func childClosed(_ id: ObjectIdentifier) {
        let (admitted, abandoned): (CheckedContinuation<Bool, Never>?, CheckedContinuation<Bool, Never>?) = state.withLock { state in
            state.children.removeValue(forKey: id)
            if case .ready(let carrier) = state.datagrams, ObjectIdentifier(carrier) == id {
                state.datagrams = .failed(QXferError(.connectionClosed, "the datagram carrier of this connection closed"))
            }
            if let index = state.waitingStreams.firstIndex(where: { $0.0 == id }) {
                return (nil, state.waitingStreams.remove(at: index).1)
            }
            guard state.openStreams.remove(id) != nil, !state.waitingStreams.isEmpty else { return (nil, nil) }
            let (next, waiter) = state.waitingStreams.removeFirst()
            state.openStreams.insert(next)
            return (waiter, nil)
        }
        admitted?.resume(returning: true)
        abandoned?.resume(returning: false)
    }

    // MARK: Listener side

    /// Admits a child the listener received: a stream once a slot is free, the datagram
    /// carrier if there is none yet.
    fileprivate func admit(_ child: TLSByteStream, kind: TLSChildProtocol.Kind) async -> TLSChildProtocol.Status {
        if kind == .stream && state.withLock({ $0.peerFinished }) { return .refused }
        do { try register(child) } catch { return .unknownConnection }
        let id = ObjectIdentifier(child)
        switch kind {
        case .stream:
            enum Slot { case open, wait, refuse }
            let slot: Slot = state.withLock { state in
                if state.openStreams.count < TLSChildProtocol.maximumStreams {
                    state.openStreams.insert(id)
                    return .open
                }
                return state.waitingStreams.count < TLSChildProtocol.maximumWaitingStreams ? .wait : .refuse
            }
            switch slot {
            case .refuse: return .refused
            case .wait:
                let admitted = await withCheckedContinuation { continuation in
                    let closed = state.withLock { state in
                        // Closed meanwhile (the parent, or this child giving up): nothing to wait for.
                        if state.closed || state.children[id] == nil { return true }
                        state.waitingStreams.append((id, continuation))
                        return false
                    }
                    if closed { continuation.resume(returning: false) }
                }
                guard admitted else { return .unknownConnection }
            case .open: break
            }
            // Answer before the application can see the stream: its first bytes must follow.
            try? await child.write(ByteBuffer(bytes: [TLSChildProtocol.Status.accepted.rawValue]))
            let waiter: CheckedContinuation<(any ByteStreamTransport)?, Never>? = state.withLock { state in
                guard !state.closed else { return nil }
                if state.acceptWaiters.isEmpty {
                    state.incoming.append(child)
                    return nil
                }
                return state.acceptWaiters.removeFirst()
            }
            waiter?.resume(returning: child)
            return .accepted
        case .datagrams:
            let accepted = state.withLock { state in
                guard case .none = state.datagrams else { return false }
                state.datagrams = .ready(child)
                return true
            }
            guard accepted else { return .refused }
            try? await child.write(ByteBuffer(bytes: [TLSChildProtocol.Status.accepted.rawValue]))
            await inbox.receive(from: child)
            return .accepted
        }
    }

    // MARK: StreamMultiplexer

    func openStream() async throws -> any ByteStreamTransport {
        guard case .client(let connector) = role else {
            throw QXferError(.unsupported, "on TCP+TLS only the client opens streams: each is a new connection to the listener")
        }
        return try await connector.connect(kind: .stream, token: token) { try self.register($0) }
    }

    func acceptStream() async throws -> (any ByteStreamTransport)? {
        await withCheckedContinuation { continuation in
            let immediate: (any ByteStreamTransport)?? = state.withLock { state in
                if !state.incoming.isEmpty { return .some(state.incoming.removeFirst()) }
                if state.closed || state.peerFinished { return .some(nil) }
                state.acceptWaiters.append(continuation)
                return .none
            }
            if let immediate { continuation.resume(returning: immediate) }
        }
    }

    func sendDatagram(_ payload: ByteBuffer) async throws {
        guard payload.readableBytes <= TLSChildProtocol.maximumDatagramSize else {
            throw QXferError(
                .invalidUse,
                "cannot send a \(payload.readableBytes)-byte datagram: at most \(TLSChildProtocol.maximumDatagramSize) bytes fit")
        }
        guard let carrier = try await datagramCarrier() else { return }  // unreliable: dropped
        var frame = ByteBuffer()
        frame.reserveCapacity(2 + payload.readableBytes)
        frame.writeInteger(UInt16(payload.readableBytes))
        frame.writeImmutableBuffer(payload)
        try await carrier.write(frame)
    }

    func receiveDatagram() async throws -> ByteBuffer? {
        // Once a carrier was attached, its datagrams are read to the end even after it closed.
        if case .client = role, !inbox.isAttached { _ = try await datagramCarrier() }
        return try await inbox.next()
    }

    func maximumDatagramSize() async -> Int? { TLSChildProtocol.maximumDatagramSize }

    func migrate(localHost: String?) async throws {
        throw QXferError(.unsupported, "connection migration needs QUIC: a TCP connection is bound to its addresses")
    }

    /// Closes the parent and every child; TCP+TLS has no place for the code and reason.
    func close(errorCode: UInt64, reason: String) {
        let parent = state.withLock { $0.parent }
        close()
        parent?.close(promise: nil)
    }

    /// The datagram carrier, connected on first use by a client; nil on a listener whose client
    /// has not opened one yet.
    private func datagramCarrier() async throws -> TLSByteStream? {
        enum Step { case ready(TLSByteStream), connect(TLSChildConnector), wait, none, failed(QXferError) }
        let step: Step = state.withLock { state in
            switch state.datagrams {
            case .ready(let carrier): return .ready(carrier)
            case .failed(let error): return .failed(error)
            case .connecting: return .wait
            case .none:
                guard case .client(let connector) = role else { return .none }
                state.datagrams = .connecting([])
                return .connect(connector)
            }
        }
        switch step {
        case .ready(let carrier): return carrier
        case .failed(let error): throw error
        case .none: return nil
        case .wait:
            return try await withCheckedThrowingContinuation { continuation in
                let immediate: Result<TLSByteStream, QXferError>? = state.withLock { state in
                    switch state.datagrams {
                    case .connecting(var waiters):
                        waiters.append(continuation)
                        state.datagrams = .connecting(waiters)
                        return nil
                    case .ready(let carrier): return .success(carrier)
                    case .failed(let error): return .failure(error)
                    case .none: return .failure(QXferError(.connectionClosed, "the datagram carrier is gone"))
                    }
                }
                if let immediate { continuation.resume(with: immediate) }
            }
        case .connect(let connector):
            let result: Result<TLSByteStream, QXferError>
            do {
                let carrier = try await connector.connect(kind: .datagrams, token: token) { try self.register($0) }
                await inbox.receive(from: carrier)
                result = .success(carrier)
            } catch {
                result = .failure((error as? QXferError) ?? TLSErrors.describe(error, during: "opening the datagram carrier", offered: [TLSChildProtocol.alpn]))
            }
            let waiters: [CheckedContinuation<TLSByteStream, any Error>] = state.withLock { state in
                guard case .connecting(let waiters) = state.datagrams else { return [] }
                switch result {
                case .success(let carrier): state.datagrams = .ready(carrier)
                case .failure(let error): state.datagrams = .failed(error)
                }
                return waiters
            }
            for waiter in waiters { waiter.resume(with: result.mapError { $0 as any Error }) }
            if case .success(let carrier) = result, isClosed { carrier.close() }
            return try result.get()
        }
    }
}

/// Received datagrams: decoded from the carrier's bytes on its event loop, kept for one reader;
/// when the reader falls behind, the oldest are dropped, as QUIC's are.
final class DatagramInbox: Sendable {
    private struct State {
        var queue: [ByteBuffer] = []
        var pending = ByteBuffer()
        var finished = false
        var attached = false
        var waiter: CheckedContinuation<ByteBuffer?, any Error>?
    }
    private let state = Locked(State())

    /// Whether a carrier's bytes come here (it may have ended since).
    var isAttached: Bool { state.withLock { $0.attached } }

    /// Takes over `carrier`'s bytes from now on.
    func receive(from carrier: TLSByteStream) async {
        state.withLock { $0.attached = true }
        let bridge = carrier.bridge
        let channel = carrier.channel
        try? await channel.eventLoop.submit {
            bridge.value.redirect { [self] buffer in
                guard let buffer else {
                    // The carrier has no half-close: its end ends the datagrams both ways.
                    channel.close(promise: nil)
                    return finish()
                }
                if !feed(buffer) { channel.close(promise: nil) }
            }
        }.get()
    }

    /// Appends bytes and delivers every complete datagram; false if the bytes are malformed.
    func feed(_ bytes: ByteBuffer) -> Bool {
        let (delivered, valid): ([(CheckedContinuation<ByteBuffer?, any Error>, ByteBuffer)], Bool) = state.withLock { state in
            var bytes = bytes
            state.pending.writeBuffer(&bytes)
            var delivered: [(CheckedContinuation<ByteBuffer?, any Error>, ByteBuffer)] = []
            while let length = state.pending.getInteger(at: state.pending.readerIndex, as: UInt16.self) {
                guard Int(length) <= TLSChildProtocol.maximumDatagramSize else { return (delivered, false) }
                guard state.pending.readableBytes >= 2 + Int(length) else { break }
                state.pending.moveReaderIndex(forwardBy: 2)
                let datagram = state.pending.readSlice(length: Int(length))!
                // A copy: a slice would keep the whole receive buffer alive while queued.
                let copy = ByteBuffer(bytes: datagram.readableBytesView)
                if let waiter = state.waiter {
                    state.waiter = nil
                    delivered.append((waiter, copy))
                } else {
                    if state.queue.count >= TLSChildProtocol.incomingDatagramLimit { state.queue.removeFirst() }
                    state.queue.append(copy)
                }
            }
            state.pending.discardReadBytes()
            return (delivered, true)
        }
        for (waiter, datagram) in delivered { waiter.resume(returning: datagram) }
        return valid
    }

    /// The next datagram; nil once the carrier or the connection has closed.
    func next() async throws -> ByteBuffer? {
        try await withCheckedThrowingContinuation { continuation in
            let immediate: Result<ByteBuffer?, QXferError>? = state.withLock { state in
                if !state.queue.isEmpty { return .success(state.queue.removeFirst()) }
                if state.finished { return .success(nil) }
                guard state.waiter == nil else {
                    return .failure(QXferError(.invalidUse, "another task is already receiving datagrams on this connection"))
                }
                state.waiter = continuation
                return nil
            }
            if let immediate { continuation.resume(with: immediate.mapError { $0 as any Error }) }
        }
    }

    /// Ends the datagrams: the reader gets what is queued, then nil.
    func finish() {
        let waiter = state.withLock { state in
            state.finished = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: nil)
    }
}
