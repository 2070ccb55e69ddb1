import Logging
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity
@_spi(Stacks) import QXferSockets

/// The TCP+TLS stack: a TLS 1.3 channel from swift-nio-ssl, seen as a ``ByteStreamTransport``.
///
/// A connection with ALPN `qxfer/1` (or the application's own) is a parent: its
/// ``TLSStreamMultiplexer`` opens and accepts extra streams and carries datagrams, each on a child
/// connection of its own (see TLSStreamMultiplexer.swift). Children share the parent's session.
final class TLSByteStream: ByteStreamTransport {
    let channel: any Channel
    let peer: PeerIdentity
    let bridge: NIOLoopBound<InboundBridge>
    /// The connection's exporter; nil if its secret was not captured (a child connection).
    let exporter: TLSExporter?
    private let link = Locked<(session: TLSStreamMultiplexer, isChild: Bool)?>(nil)

    init(channel: any Channel, bridge: NIOLoopBound<InboundBridge>, peer: PeerIdentity, exporter: TLSExporter?) {
        self.channel = channel
        self.bridge = bridge
        self.peer = peer
        self.exporter = exporter
    }

    /// Makes this connection the parent of `session`, which ends when the connection does.
    func adopt(_ session: TLSStreamMultiplexer) {
        link.withLock { $0 = (session, false) }
        session.attach(parent: channel)
        channel.closeFuture.whenComplete { _ in session.close() }
        let bridge = self.bridge
        channel.eventLoop.execute { bridge.value.whenEnded { session.peerFinished() } }
    }

    /// Makes this connection a child of `session` (an extra stream or the datagram carrier).
    func join(_ session: TLSStreamMultiplexer) {
        link.withLock { $0 = (session, true) }
    }

    /// The session this connection belongs to, as parent or child.
    var session: TLSStreamMultiplexer? { link.withLock { $0?.session } }

    /// A TLS exporter value (RFC 8446 section 7.5) of this connection.
    func tlsExporter(label: String, context: [UInt8], length: Int) throws -> [UInt8] {
        guard let exporter else { throw QXferError(.unsupported, "this TLS connection has no exporter secret") }
        return exporter.export(label: label, context: context, length: length)
    }

    func exportKeyingMaterial(label: String, context: [UInt8], length: Int) async throws -> [UInt8] {
        guard (1...255).contains(length) else { throw QXferError(.invalidUse, "exporter length \(length) out of range") }
        return try tlsExporter(label: label, context: context, length: length)
    }

    func write(_ buffer: ByteBuffer) async throws {
        do {
            try await channel.writeAndFlush(buffer).get()
        } catch {
            throw await explain(error)
        }
    }

    func read() async throws -> [ByteBuffer]? {
        try await read(atLeast: 1)
    }

    func read(atLeast minimum: Int) async throws -> [ByteBuffer]? {
        let bridge = self.bridge
        do {
            return try await channel.eventLoop.flatSubmit { bridge.value.next(atLeast: minimum, on: bridge.eventLoop) }.get()
        } catch {
            throw await explain(error)
        }
    }

    func finish() async throws {
        do {
            try await channel.close(mode: .output)  // TLS close_notify, then TCP FIN
        } catch {
            throw await explain(error)
        }
    }

    /// On a child (an extra stream), an abortive close: TCP RST without close_notify, so the
    /// peer's reads fail instead of ending cleanly. TCP has no place for `errorCode`.
    func reset(errorCode: UInt64) {
        guard let link = link.withLock({ $0 }), link.isChild else {
            channel.close(promise: nil)
            return
        }
        // SO_LINGER with a zero timeout makes close() send RST and drop unsent data.
        guard let socket = channel as? any SocketOptionProvider else {
            channel.close(promise: nil)
            return
        }
        let channel = self.channel
        socket.setSoLinger(linger(l_onoff: 1, l_linger: 0)).whenComplete { _ in
            // Closed from below the TLS handler, which would otherwise send close_notify first.
            if let tls = try? channel.pipeline.syncOperations.context(handlerType: NIOSSLHandler.self) {
                tls.close(promise: nil)
            } else {
                channel.close(promise: nil)
            }
        }
    }

    func close() {
        if let link = link.withLock({ $0 }), !link.isChild { link.session.close() }
        channel.close(promise: nil)
    }

    var multiplexer: (any StreamMultiplexer)? { session }

    /// The parent's metrics count what its children (the session's other TCP connections)
    /// have not had acknowledged too: a sender's files travel on them.
    func metrics() async -> ConnectionMetrics {
        var metrics = await SocketTuning.metrics(of: channel)
        if let link = link.withLock({ $0 }), !link.isChild, let own = metrics.bytesUnacknowledged {
            var total = own
            for child in link.session.openChildren {
                let (sum, overflow) = total.addingReportingOverflow(await SocketTuning.unacknowledgedBytes(of: child.channel))
                total = overflow ? .max : sum
            }
            metrics.bytesUnacknowledged = total
        }
        return metrics
    }

    var hasEnded: Bool {
        get async {
            let bridge = self.bridge
            return (try? await channel.eventLoop.submit { bridge.value.hasEnded }.get()) ?? true
        }
    }

    /// Turns a channel error into a one-line ``QXferError``, preferring the reason the bridge
    /// recorded when it closed the channel itself.
    private func explain(_ error: any Error) async -> QXferError {
        let bridge = self.bridge
        let offered = [peer.applicationProtocol]
        let recorded = try? await channel.eventLoop.submit { () -> QXferError? in
            if let reason = bridge.value.closeReason { return reason }
            return bridge.value.firstError.map { TLSErrors.describe($0, during: "the connection", offered: offered) }
        }.get()
        if let recorded = recorded ?? nil, recorded.code != .connectionClosed { return recorded }
        return TLSErrors.describe(error, during: "the connection", offered: offered)
    }
}

extension TLSByteStream {
    static let logger = Logger(label: "qxfer.tls")

    /// Connects to `endpoint`, racing its addresses (Happy Eyeballs), and completes the handshake.
    static func connect<Stack>(
        to endpoint: Endpoint, tls: TLS, parameters: NetworkParameters<Stack>, timeout: Duration,
        peerAnswered: @Sendable () -> Void = {}
    ) async throws -> TLSByteStream {
        let identity = try tls.identity ?? HostIdentity.loadOrCreate()
        let trust = parameters.peerFingerprint.map { PeerTrust.pinned($0) } ?? tls.peerTrust
        let hostKey = KnownHosts.key(host: endpoint.host, port: Int(endpoint.port))
        let secrets = ExporterSecrets()
        let context = try makeContext(identity: identity, tls: tls, role: .client, exporterSecrets: secrets)
        let settings = SocketTuning.Settings(parameters, tcp: tls.tcp)
        let idle = parameters.idleTimeout
        let verifier = PeerVerifier(.client(trust, hostKey: hostKey))

        let setup: Setup
        do {
            let bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(TimeAmount(timeout))
                .channelOption(.allowRemoteHalfClosure, value: true)
            let initializer: @Sendable (any Channel) -> EventLoopFuture<Setup> = { channel in
                channel.eventLoop.makeCompletedFuture {
                    SocketTuning.apply(settings, to: channel)
                    let tlsHandler = try NIOSSLClientHandler(
                        context: context, serverHostname: nil, customVerificationCallback: verifier.verify)
                    return try Setup.install(
                        tlsHandler, accepting: tls.applicationProtocols, idle: idle,
                        exporterSecrets: (secrets, isServer: false), on: channel)
                }
            }
            if let literal = try? SocketAddress(ipAddress: endpoint.host, port: Int(endpoint.port)) {
                // An address needs no resolver: asking DNS for the AAAA record of "127.0.0.1"
                // can take seconds where no DNS server answers.
                setup = try await bootstrap.connect(to: literal, channelInitializer: initializer)
            } else {
                setup = try await bootstrap.connect(host: endpoint.host, port: Int(endpoint.port), channelInitializer: initializer)
            }
        } catch let error as NIOConnectionError where error.connectionErrors.isEmpty && (error.dnsAError != nil || error.dnsAAAAError != nil) {
            throw QXferError(.connectFailed, "cannot resolve \(endpoint.host): no address for that name", underlying: NameDoesNotResolve(host: endpoint.host))
        } catch {
            throw QXferError(.connectFailed, "cannot connect to \(endpoint): \(ChannelErrors.reason(error))", underlying: error)
        }
        logger.info("TCP connected to \(endpoint) at \(setup.channel.remoteAddress?.description ?? "?"); TLS handshake")
        peerAnswered()
        let stream = try await setup.finishHandshake(verifier: verifier, peerName: endpoint.description, timeout: timeout)
        logger.info("TLS 1.3 handshake with \(endpoint) done: ALPN \(stream.peer.applicationProtocol), peer \(stream.peer.fingerprint?.description ?? "-") trusted as \(stream.peer.trust)")
        // Record a first contact only now that the handshake, ALPN included, has succeeded.
        do {
            try verifier.recordAfterHandshake(peer: stream.peer.fingerprint)
        } catch {
            stream.close()
            throw error
        }
        if let remote = stream.channel.remoteAddress, let token = try? TLSStreamMultiplexer.token(of: stream) {
            let connector = TLSChildConnector(
                address: remote, identity: identity, tls: tls, settings: settings, idle: idle,
                serverPeer: stream.peer, timeout: parameters.connectTimeout)
            stream.adopt(TLSStreamMultiplexer(client: connector, token: token, peer: stream.peer))
        }
        return stream
    }

    /// The pipeline of one connection: TLS, handshake observer, idle timer, bridge to async.
    struct Setup: Sendable {
        let channel: any Channel
        let handshake: EventLoopFuture<String>
        let bridge: NIOLoopBound<InboundBridge>
        /// The application protocols this end accepts, named when the peer speaks none of them.
        let acceptedProtocols: [String]
        /// The listener's per-connection verifier (clients keep theirs on the stack).
        var verifier: PeerVerifier?

        /// The client random observer, when the connection's exporter is wanted.
        var randomObserver: NIOLoopBound<ClientRandomObserver>?

        static func install(
            _ tlsHandler: some ChannelHandler, accepting acceptedProtocols: [String], idle: Duration?,
            exporterSecrets: (ExporterSecrets, isServer: Bool)?, readAhead: ReadAheadBudget? = nil, on channel: any Channel
        ) throws -> Setup {
            let promise = channel.eventLoop.makePromise(of: String.self)
            let bridge = InboundBridge(budget: readAhead)
            let pipeline = channel.pipeline.syncOperations
            var randomObserver: NIOLoopBound<ClientRandomObserver>?
            if let (secrets, isServer) = exporterSecrets {
                let observer = ClientRandomObserver(isServer: isServer, secrets: secrets)
                try pipeline.addHandler(observer)  // below TLS: it sees the ClientHello's bytes
                randomObserver = NIOLoopBound(observer, eventLoop: channel.eventLoop)
            }
            try pipeline.addHandler(tlsHandler)
            try pipeline.addHandler(HandshakeObserver(promise: promise, accepted: acceptedProtocols))
            try pipeline.addHandler(bridge)
            // The idle timer starts once the handshake is done: a slow handshake is the
            // handshake timeout's business, not an idle connection.
            let bound = NIOLoopBound(bridge, eventLoop: channel.eventLoop)
            let handshake = promise.futureResult.flatMapThrowing { alpn in
                if let idle {
                    try channel.pipeline.syncOperations.addHandler(
                        IdleStateHandler(allTimeout: TimeAmount(idle)), position: .before(bound.value))
                }
                return alpn
            }
            return Setup(
                channel: channel, handshake: handshake, bridge: bound, acceptedProtocols: acceptedProtocols,
                randomObserver: randomObserver)
        }

        /// Waits for the handshake and turns its failure into the verifier's precise reason.
        func finishHandshake(verifier: PeerVerifier, peerName: String, timeout: Duration) async throws -> TLSByteStream {
            let timer = channel.eventLoop.scheduleTask(in: TimeAmount(timeout)) { [channel] in
                channel.close(promise: nil)
            }
            defer { timer.cancel() }
            let alpn: String
            do {
                alpn = try await handshake.get()
            } catch {
                channel.close(promise: nil)
                if let failure = verifier.result.failure { throw failure }
                if let error = error as? QXferError { throw error }
                throw TLSErrors.describe(
                    error, during: "the TLS handshake with \(peerName)",
                    offered: acceptedProtocols.filter { $0 != TLSChildProtocol.alpn })
            }
            let outcome = verifier.result
            let peer = PeerIdentity(fingerprint: outcome.fingerprint, trust: outcome.trust, applicationProtocol: alpn)
            // The exporter secret was logged during the handshake, on this event loop.
            var exporter: TLSExporter?
            if let randomObserver {
                exporter = try? await channel.eventLoop.submit { randomObserver.value.takeExporter() }.get()
            }
            return TLSByteStream(channel: channel, bridge: bridge, peer: peer, exporter: exporter)
        }
    }

    enum Role { case client, server(ClientAuthentication) }

    /// A TLS context for `role`. A server also accepts the child-connection protocol
    /// (``TLSChildProtocol/alpn``); `exporterSecrets` receives each handshake's exporter secret.
    static func makeContext(
        identity: HostIdentity, tls: TLS, role: Role, exporterSecrets: ExporterSecrets?
    ) throws -> NIOSSLContext {
        do {
            let certificate = try NIOSSLCertificate(bytes: identity.certificateDER, format: .der)
            let key = try NIOSSLPrivateKey(bytes: Array(identity.privateKeyPEM.utf8), format: .pem)
            var configuration: TLSConfiguration
            switch role {
            case .client:
                configuration = .makeClientConfiguration()
                configuration.certificateChain = [.certificate(certificate)]
                configuration.privateKey = .privateKey(key)
                configuration.certificateVerification = .noHostnameVerification
            case .server(let authentication):
                configuration = .makeServerConfiguration(certificateChain: [.certificate(certificate)], privateKey: .privateKey(key))
                switch authentication.kind {
                case .none: configuration.certificateVerification = .none
                case .optional: configuration.certificateVerification = .optionalVerification
                case .required: configuration.certificateVerification = .noHostnameVerification
                }
            }
            // Trust is decided by fingerprint in PeerVerifier; no certificate authority is consulted.
            configuration.trustRoots = .certificates([])
            // Closing waits this long for the peer's close_notify; the default 5 s kept sockets
            // open long after both sides were done.
            configuration.shutdownTimeout = .milliseconds(500)
            configuration.minimumTLSVersion = .tlsv13
            configuration.maximumTLSVersion = .tlsv13
            configuration.applicationProtocols = tls.applicationProtocols
            if case .server = role { configuration.applicationProtocols.append(TLSChildProtocol.alpn) }
            configuration.keyLogCallback = exporterSecrets?.keyLogCallback
            return try NIOSSLContext(configuration: configuration)
        } catch {
            throw QXferError(.identity, "cannot use the host identity for TLS: \(error)", underlying: error)
        }
    }
}

/// Completes a promise with the negotiated ALPN once the handshake is done, refusing a peer
/// that did not agree on one of ours: BoringSSL lets a handshake without ALPN succeed.
final class HandshakeObserver: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let promise: EventLoopPromise<String>
    private let accepted: [String]
    private var done = false

    init(promise: EventLoopPromise<String>, accepted: [String]) {
        self.promise = promise
        self.accepted = accepted
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .handshakeCompleted(let negotiated)? = event as? TLSUserEvent, !done {
            done = true
            if let negotiated, accepted.contains(negotiated) {
                promise.succeed(negotiated)
            } else {
                promise.fail(QXferError(
                    .protocolMismatch,
                    "the peer does not speak \(accepted.joined(separator: " or ")) (it negotiated \(negotiated ?? "no application protocol"))"))
                context.close(promise: nil)
                return
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(error)
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        fail(QXferError(.handshakeFailed, "the peer closed the connection during the TLS handshake"))
        context.fireChannelInactive()
    }

    /// A connect attempt that fails (or loses the Happy Eyeballs race) before the channel is
    /// active never sees channelInactive: the promise must not outlive the pipeline.
    func handlerRemoved(context: ChannelHandlerContext) {
        fail(QXferError(.connectFailed, "the connection attempt ended before the TLS handshake"))
    }

    private func fail(_ error: any Error) {
        guard !done else { return }
        done = true
        promise.fail(error)
    }
}

/// One-line descriptions of NIO and TLS errors.
/// One-line descriptions of the TCP+TLS stack's errors: swift-nio-ssl's and BoringSSL's, over
/// the socket wording both stacks share (``ChannelErrors``).
enum TLSErrors {
    /// `offered` names the application protocols in a "does not speak" refusal.
    static func describe(_ error: any Error, during what: String, offered: [String]) -> QXferError {
        if let error = error as? QXferError { return error }
        if let tls = error as? NIOSSLError {
            switch tls {
            case .uncleanShutdown:
                return QXferError(.connectionClosed, "the peer closed \(what) abruptly", underlying: error)
            case .handshakeFailed(let inner):
                if let refusal = alert(inner, offered: offered) { return refusal.caused(by: error) }
                return QXferError(.handshakeFailed, "\(what) failed: \(inner)", underlying: error)
            default:
                return QXferError(.handshakeFailed, "\(what) failed: \(tls)", underlying: error)
            }
        }
        if let boring = error as? BoringSSLError, let refusal = alert(boring, offered: offered) {
            return refusal.caused(by: error)
        }
        return ChannelErrors.lost(error, during: what)
    }

    /// BoringSSL reports a peer's refusal as an alert buried in an error stack. In TLS 1.3 a
    /// client learns that its certificate was refused only after its side of the handshake,
    /// on its first read, so this applies to any TLS error.
    static func alert(_ error: BoringSSLError, offered: [String]) -> QXferError? {
        let text = "\(error)"
        if text.contains("CERTIFICATE_REQUIRED") || text.contains("PEER_DID_NOT_RETURN_A_CERTIFICATE") {
            return .peerRequiresClientCertificate
        }
        if text.contains("ALERT_CERTIFICATE_UNKNOWN") || text.contains("ALERT_BAD_CERTIFICATE") {
            return .peerRefusedCertificate
        }
        if text.contains("UNSUPPORTED_PROTOCOL") || text.contains("PROTOCOL_VERSION") {
            return .peerLacksTLS13
        }
        // The first bytes back were not a TLS record (BoringSSL reads their version field).
        if text.contains("WRONG_VERSION_NUMBER") {
            return .peerSpeaksNoTLS
        }
        if text.contains("NO_APPLICATION_PROTOCOL") {
            return .noCommonApplicationProtocol(offered: offered)
        }
        return nil
    }
}

#if canImport(Glibc)
import Glibc
#endif
