import Logging
import NIOCore
import NIOPosix
import NIOSSL
import QUICEngine

/// Accepts connections on a port and runs each in its own child task.
///
/// ```swift
/// try await NetworkListener(on: 4433) { TLS() }.run { connection in
///     let request = try await connection.receive(atLeast: 1, atMost: 1024).content
///     try await connection.send(request)
/// }
/// ```
///
/// `run` returns only when its task is cancelled (or binding fails); cancelling it stops
/// accepting, cancels every connection's task and closes every connection.
public final class NetworkListener<Stack: NetworkProtocolStack>: Sendable {
    /// The stack and parameters each accepted connection uses.
    public let parameters: NetworkParameters<Stack>
    /// The address to bind; nil binds every address (IPv6 and IPv4).
    public let host: String?
    /// The requested port (0 picks a free one; see ``port``).
    public let requestedPort: UInt16
    /// How long a client may take to complete its handshake before it is dropped.
    public let handshakeTimeout: Duration
    /// QUIC: with this many clients still in their handshake, new ones first prove their
    /// address with a Retry round trip (RFC 9000 section 8.1.2). 0 validates every client.
    let retryAbovePendingHandshakes: Int

    private let bound = Locked<BoundState>(.unbound([]))
    private static var logger: Logger { Logger(label: "qxfer.listener") }

    private enum BoundState {
        case unbound([CheckedContinuation<UInt16, any Error>])
        case bound(UInt16)
        case failed(QXferError)
    }

    /// A listener for a stack declaration.
    public convenience init(on port: UInt16, host: String? = nil, @NetworkStackBuilder _ stack: () -> Stack) {
        self.init(on: port, host: host, using: .parameters(stack))
    }

    /// A listener with explicit parameters.
    public convenience init(on port: UInt16, host: String? = nil, using parameters: NetworkParameters<Stack>, handshakeTimeout: Duration = .seconds(10)) {
        self.init(on: port, host: host, using: parameters, handshakeTimeout: handshakeTimeout, retryAbovePendingHandshakes: 32)
    }

    init(on port: UInt16, host: String?, using parameters: NetworkParameters<Stack>, handshakeTimeout: Duration = .seconds(10),
         retryAbovePendingHandshakes: Int) {
        self.requestedPort = port
        self.host = host
        self.parameters = parameters
        self.handshakeTimeout = handshakeTimeout
        self.retryAbovePendingHandshakes = retryAbovePendingHandshakes
    }

    /// The port the listener is bound to; waits until `run` has bound it.
    public var port: UInt16 {
        get async throws {
            try await withCheckedThrowingContinuation { continuation in
                let result: Result<UInt16, QXferError>? = bound.withLock { state in
                    switch state {
                    case .unbound(var waiters):
                        waiters.append(continuation)
                        state = .unbound(waiters)
                        return nil
                    case .bound(let port): return .success(port)
                    case .failed(let error): return .failure(error)
                    }
                }
                if let result { continuation.resume(with: result) }
            }
        }
    }

    /// Accepts connections until the task is cancelled, calling `handler` for each in a child
    /// task. A handler's error closes its connection and is logged; it never stops the listener.
    public func run(_ handler: @escaping @Sendable (NetworkConnection<Stack>) async throws -> Void) async throws {
        switch parameters.stack.transport.kind {
        case .tls(let tls):
            try await runTLS(tls, handler)
        case .quic(let quic):
            try await runQUIC(quic, handler)
        }
    }

    private func runQUIC(_ quic: QUIC, _ handler: @escaping @Sendable (NetworkConnection<Stack>) async throws -> Void) async throws {
        let (accepted, continuation) = AsyncStream.makeStream(
            of: (NIOLoopBound<QUICConnectionDriver>, PeerIdentity, Endpoint?).self, bufferingPolicy: .bufferingOldest(256))
        let channel: any Channel
        do {
            let identity = try quic.identity ?? HostIdentity.loadOrCreate()
            let parameters = self.parameters
            // Derived from the identity, so a restarted receiver can still tell stale clients
            // that their connection is gone (RFC 9000 section 10.3).
            let secret = identity.statelessResetSecret
            let makeConfiguration: @Sendable () -> (QUICConfiguration, PeerVerifier) = {
                let verifier = PeerVerifier(.server(quic.clientAuthentication))
                let configuration = QUICTransport.configuration(
                    quic, identity: identity, parameters: parameters, verifier: verifier, isServer: true, resetSecret: secret)
                return (configuration, verifier)
            }
            let template = makeConfiguration().0
            let server = QUICSocketHandler.Server(
                makeConfiguration: makeConfiguration,
                acceptedProtocols: quic.applicationProtocols,
                accepted: { driver in
                    let outcome = driver.verifier.result
                    let peer = PeerIdentity(
                        fingerprint: outcome.fingerprint, trust: outcome.trust,
                        applicationProtocol: driver.engine.negotiatedALPN ?? "")
                    let remote = driver.engine.path.remote.socketAddress.flatMap { address -> Endpoint? in
                        guard let ip = address.ipAddress, let port = address.port else { return nil }
                        return .hostPort(host: ip, port: UInt16(port))
                    }
                    if case .dropped = continuation.yield((NIOLoopBound(driver, eventLoop: driver.eventLoop), peer, remote)) {
                        driver.close(code: 0x2, reason: "too many pending connections")
                    }
                },
                statelessResetSecret: secret,
                connectionIDLength: template.connectionIDLength,
                connectionIDPrefix: template.connectionIDPrefix,
                retryAbovePendingHandshakes: retryAbovePendingHandshakes)
            let trafficClass = parameters.serviceClass.trafficClass
            let bootstrap = DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .channelOption(.socketOption(.so_reuseaddr), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try QUICTransport.tune(channel, trafficClass: trafficClass)
                        try channel.pipeline.syncOperations.addHandler(QUICSocketHandler(server: server))
                    }
                }
            if let host {
                channel = try await bootstrap.bind(host: host, port: Int(requestedPort)).get()
            } else {
                do {
                    channel = try await bootstrap.bind(host: "::", port: Int(requestedPort)).get()
                } catch {
                    channel = try await bootstrap.bind(host: "0.0.0.0", port: Int(requestedPort)).get()
                }
            }
        } catch {
            let failure = (error as? QXferError)
                ?? QXferError(.bindFailed, "cannot listen on UDP port \(requestedPort): \(ChannelErrors.reason(error))", underlying: error)
            resolvePort(.failure(failure))
            throw failure
        }
        channel.closeFuture.whenComplete { _ in continuation.finish() }
        resolvePort(.success(UInt16(channel.localAddress?.port ?? Int(requestedPort))))

        let parameters = self.parameters
        await withTaskCancellationHandler {
            await withDiscardingTaskGroup { group in
                for await (driver, peer, remote) in accepted {
                    group.addTask {
                        let stream = driver.eventLoop.flatSubmit { driver.value.primaryStream }
                        let transport = QUICStreamTransport(driver: driver, stream: stream, peer: peer)
                        await Self.serve(NetworkConnection(accepted: transport, parameters: parameters, remote: remote), handler: handler)
                    }
                }
            }
        } onCancel: {
            channel.eventLoop.execute {
                (try? channel.pipeline.syncOperations.handler(type: QUICSocketHandler.self))?.shutdown()
                continuation.finish()
            }
        }
        try? await channel.close()
    }

    private func runTLS(_ tls: TLS, _ handler: @escaping @Sendable (NetworkConnection<Stack>) async throws -> Void) async throws {
        let server: NIOAsyncChannel<TLSByteStream.Setup, Never>
        let verifierFactory: @Sendable () -> PeerVerifier
        // Extra streams and datagrams arrive as child connections naming their parent.
        let sessions = TLSSessionRegistry()
        do {
            let identity = try tls.identity ?? HostIdentity.loadOrCreate()
            let secrets = ExporterSecrets()
            let context = try TLSByteStream.makeContext(
                identity: identity, tls: tls, role: .server(tls.clientAuthentication), exporterSecrets: secrets)
            let settings = SocketTuning.Settings(parameters, tcp: tls.tcp)
            let idle = parameters.idleTimeout
            verifierFactory = { PeerVerifier(.server(tls.clientAuthentication)) }
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
                        exporterSecrets: (secrets, isServer: true), on: channel)
                    setup.verifier = verifier
                    return setup
                }
            }
            if let host {
                server = try await bootstrap.bind(host: host, port: Int(requestedPort), childChannelInitializer: initializer)
            } else {
                do {
                    server = try await bootstrap.bind(host: "::", port: Int(requestedPort), childChannelInitializer: initializer)
                } catch {
                    // No IPv6 on this host (or in this namespace): IPv4 only.
                    server = try await bootstrap.bind(host: "0.0.0.0", port: Int(requestedPort), childChannelInitializer: initializer)
                }
            }
        } catch {
            let failure = (error as? QXferError)
                ?? QXferError(.bindFailed, "cannot listen on port \(requestedPort): \(ChannelErrors.reason(error))", underlying: error)
            resolvePort(.failure(failure))
            throw failure
        }
        resolvePort(.success(UInt16(server.channel.localAddress?.port ?? Int(requestedPort))))

        let parameters = self.parameters
        let handshakeTimeout = self.handshakeTimeout
        try await server.executeThenClose { inbound in
            await withDiscardingTaskGroup { group in
                do {
                    for try await setup in inbound {
                        group.addTask {
                            await Self.serve(
                                setup, parameters: parameters, sessions: sessions, handshakeTimeout: handshakeTimeout, handler: handler)
                        }
                    }
                } catch {
                    Self.logger.debug("listener stopped accepting: \(error)")
                }
            }
        }
    }

    private static func serve(
        _ setup: TLSByteStream.Setup, parameters: NetworkParameters<Stack>, sessions: TLSSessionRegistry,
        handshakeTimeout: Duration, handler: @Sendable (NetworkConnection<Stack>) async throws -> Void
    ) async {
        let remote = setup.channel.remoteAddress.flatMap { address -> Endpoint? in
            guard let ip = address.ipAddress, let port = address.port else { return nil }
            return .hostPort(host: ip, port: UInt16(port))
        }
        let stream: TLSByteStream
        do {
            stream = try await setup.finishHandshake(
                verifier: setup.verifier!, peerName: remote?.description ?? "a client", timeout: handshakeTimeout)
        } catch {
            logger.debug("refused \(remote?.description ?? "a client"): \(error)")
            return
        }
        if stream.peer.applicationProtocol == TLSChildProtocol.alpn {
            // An extra stream or a datagram carrier: it goes to its parent, not to the handler.
            await sessions.admit(stream, timeout: handshakeTimeout)
            return
        }
        if let token = try? TLSSession.token(of: stream) {
            stream.adopt(TLSSession(server: sessions, token: token, peer: stream.peer))
        }
        await serve(NetworkConnection(accepted: stream, parameters: parameters, remote: remote), handler: handler)
    }

    /// Runs the application's handler; its end, error or cancellation closes the connection.
    private static func serve(
        _ connection: NetworkConnection<Stack>, handler: @Sendable (NetworkConnection<Stack>) async throws -> Void
    ) async {
        let remote = connection.endpoint
        do {
            try await withTaskCancellationHandler {
                try await handler(connection)
            } onCancel: {
                connection.cancel()
            }
        } catch {
            logger.debug("connection from \(remote?.description ?? "a client") ended: \(error)")
        }
        connection.cancel()
    }

    private func resolvePort(_ result: Result<UInt16, QXferError>) {
        let waiters: [CheckedContinuation<UInt16, any Error>] = bound.withLock { state in
            guard case .unbound(let waiters) = state else { return [] }
            switch result {
            case .success(let port): state = .bound(port)
            case .failure(let error): state = .failed(error)
            }
            return waiters
        }
        for waiter in waiters { waiter.resume(with: result.mapError { $0 as any Error }) }
    }
}
