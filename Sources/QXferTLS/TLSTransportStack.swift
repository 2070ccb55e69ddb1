import enum LinuxSystem.UsableMemory
import Logging
import NIOCore
import NIOPosix
import NIOSSL
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity
@_spi(Stacks) import QXferSockets

/// The TCP+TLS stack behind ``TLS``: its connector and its listener, seen by the API only
/// through ``TransportStack``.
struct TLSTransportStack: TransportStack {
    let tls: TLS

    var name: String { "TCP+TLS" }
    var hasIndependentStreams: Bool { false }

    func connect<Stack>(
        to endpoint: Endpoint, parameters: NetworkParameters<Stack>, timeout: Duration, peerAnswered: @escaping @Sendable () -> Void
    ) async throws -> any ByteStreamTransport {
        try await TLSByteStream.connect(to: endpoint, tls: tls, parameters: parameters, timeout: timeout, peerAnswered: peerAnswered)
    }

    func bind<Stack>(_ request: ListenRequest<Stack>) async throws -> any BoundTransportListener {
        try await TLSListener.bind(tls, request)
    }

    func describe(_ error: any Error, during what: String) -> QXferError {
        TLSErrors.describe(error, during: what, offered: tls.applicationProtocols)
    }
}

extension PeerVerifier {
    /// swift-nio-ssl's `NIOSSLCustomVerificationCallback`.
    func verify(_ chain: [NIOSSLCertificate], _ promise: EventLoopPromise<NIOSSLVerificationResult>) {
        guard let leaf = chain.first, let der = try? leaf.toDERBytes() else {
            record(failure: QXferError(.untrustedPeer, "the peer presented no usable certificate"))
            promise.succeed(.failed)
            return
        }
        promise.succeed(evaluate(certificateDER: der) ? .certificateVerified : .failed)
    }
}

/// A bound TCP+TLS listener: handshakes each client in a task of its own, hands parents to the
/// application and child connections (extra streams, datagram carriers) to their parent.
struct TLSListener<Stack: NetworkProtocolStack>: BoundTransportListener {
    let server: NIOAsyncChannel<TLSByteStream.Setup, Never>
    /// Extra streams and datagrams arrive as child connections naming their parent.
    let sessions: TLSSessionRegistry
    let handshakeTimeout: Duration
    /// Told of each client whose certificate was refused.
    let refused: @Sendable (RefusedClient) -> Void
    let port: UInt16
    /// The connections open now, against ``TLS/maximumConnections``.
    let open: OpenConnections
    private static var logger: Logger { Logger(label: "qxfer.listener") }

    static func bind(_ tls: TLS, _ request: ListenRequest<Stack>) async throws -> TLSListener {
        do {
            let parameters = request.parameters
            let identity = try tls.identity ?? HostIdentity.loadOrCreate()
            let secrets = ExporterSecrets()
            let context = try TLSByteStream.makeContext(
                identity: identity, tls: tls, role: .server(tls.clientAuthentication), exporterSecrets: secrets)
            let settings = SocketTuning.Settings(parameters, tcp: tls.tcp)
            let idle = parameters.idleTimeout
            let verifierFactory: @Sendable () -> PeerVerifier = { PeerVerifier(.server(tls.clientAuthentication)) }
            // A sixteenth of the memory this process can have (the machine's, or its control
            // group's limit if lower): 64 MiB in a 1 GiB container.
            let readAhead = ReadAheadBudget(bytes: UsableMemory.share(1, of: 16, atLeast: 32 << 20, atMost: 1 << 30))
            let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .serverChannelOption(.backlog, value: 256)
                .childChannelOption(.allowRemoteHalfClosure, value: true)
            let initializer: @Sendable (any Channel) -> EventLoopFuture<TLSByteStream.Setup> = { channel in
                channel.eventLoop.makeCompletedFuture {
                    SocketTuning.apply(settings, to: channel)
                    let verifier = verifierFactory()
                    let tlsHandler = NIOSSLServerHandler(context: context, customVerificationCallback: verifier.verify)
                    var setup = try TLSByteStream.Setup.install(
                        tlsHandler, accepting: tls.applicationProtocols + [TLSChildProtocol.alpn], idle: idle,
                        exporterSecrets: (secrets, isServer: true), readAhead: readAhead, on: channel)
                    setup.verifier = verifier
                    return setup
                }
            }
            let server = try await bindEveryAddress(host: request.host) { host in
                try await bootstrap.bind(host: host, port: Int(request.port), childChannelInitializer: initializer)
            }
            return TLSListener(
                server: server, sessions: TLSSessionRegistry(), handshakeTimeout: request.handshakeTimeout, refused: request.refused,
                port: UInt16(server.channel.localAddress?.port ?? Int(request.port)), open: OpenConnections(limit: tls.maximumConnections))
        } catch {
            throw (error as? QXferError)
                ?? QXferError(.bindFailed, "cannot listen on \(request.host.map { "\($0) " } ?? "")port \(request.port): \(ChannelErrors.reason(error))", underlying: error)
        }
    }

    func run(serving serve: @escaping @Sendable (any ByteStreamTransport, Endpoint?) async -> Void) async throws {
        let sessions = self.sessions
        let handshakeTimeout = self.handshakeTimeout
        let refused = self.refused
        let open = self.open
        try await server.executeThenClose { inbound in
            await withDiscardingTaskGroup { group in
                do {
                    for try await setup in inbound {
                        guard open.enter() else {
                            Self.logger.debug("closed a connection beyond \(open.limit) open ones")
                            setup.channel.close(promise: nil)
                            continue
                        }
                        setup.channel.closeFuture.whenComplete { _ in open.leave() }
                        // Counted here, in accept order, so that a child accepted after its
                        // parent waits for it even if the parent's task has not run yet.
                        sessions.accepted()
                        group.addTask {
                            await Self.admit(setup, sessions: sessions, handshakeTimeout: handshakeTimeout, refused: refused, serve: serve)
                        }
                    }
                } catch {
                    Self.logger.debug("listener stopped accepting: \(error)")
                }
            }
        }
    }

    private static func admit(
        _ setup: TLSByteStream.Setup, sessions: TLSSessionRegistry, handshakeTimeout: Duration,
        refused: @Sendable (RefusedClient) -> Void, serve: @Sendable (any ByteStreamTransport, Endpoint?) async -> Void
    ) async {
        let remote = setup.channel.remoteAddress?.endpoint
        let stream: TLSByteStream
        do {
            stream = try await setup.finishHandshake(
                verifier: setup.verifier!, peerName: remote?.description ?? "a client", timeout: handshakeTimeout)
        } catch {
            sessions.settled()
            logger.debug("refused \(remote?.description ?? "a client"): \(error)")
            // Its certificate refused (a verdict, not a port probe or a lost handshake).
            let outcome = setup.verifier!.result
            if let failure = outcome.failure, outcome.fingerprint != nil {
                refused(RefusedClient(address: remote, fingerprint: outcome.fingerprint, reason: failure))
            }
            return
        }
        if stream.peer.applicationProtocol == TLSChildProtocol.alpn {
            // An extra stream or a datagram carrier: it goes to its parent, not to the handler.
            sessions.settled()
            await sessions.admit(stream, timeout: handshakeTimeout)
            return
        }
        if let token = try? TLSStreamMultiplexer.token(of: stream) {
            stream.adopt(TLSStreamMultiplexer(server: sessions, token: token, peer: stream.peer))
        }
        sessions.settled()
        await serve(stream, remote)
    }
}

/// How many of a listener's connections are open, under a limit.
final class OpenConnections: Sendable {
    let limit: Int
    private let count = Locked(0)

    init(limit: Int) { self.limit = limit }

    /// Counts one more, unless the limit is reached.
    func enter() -> Bool {
        count.withLock { count in
            guard count < limit else { return false }
            count += 1
            return true
        }
    }

    func leave() { count.withLock { $0 -= 1 } }
}
