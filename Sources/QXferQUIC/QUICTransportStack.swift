import NIOCore
import NIOPosix
import QUICEngine
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity
@_spi(Stacks) import QXferSockets

/// The QUIC stack behind ``QUIC``: its connector and its listener, seen by the API only
/// through ``TransportStack``.
struct QUICTransportStack: TransportStack {
    let quic: QUIC

    var name: String { "QUIC" }
    var hasIndependentStreams: Bool { true }

    func connect<Stack>(
        to endpoint: Endpoint, parameters: NetworkParameters<Stack>, timeout: Duration, peerAnswered: @escaping @Sendable () -> Void
    ) async throws -> any ByteStreamTransport {
        try await QUICConnector.connect(to: endpoint, quic: quic, parameters: parameters, timeout: timeout, peerAnswered: peerAnswered)
    }

    func bind<Stack>(_ request: ListenRequest<Stack>) async throws -> any BoundTransportListener {
        try await QUICListener.bind(quic, request)
    }

    func racing() -> any TransportStack { QUICTransportStack(quic: quic.earlyData(false)) }

    func sendsEarly<Stack>(to endpoint: Endpoint, parameters: NetworkParameters<Stack>) -> Bool {
        QUICConnector.sendsEarly(to: endpoint, quic: quic, parameters: parameters)
    }

    /// The driver already words QUIC's close reasons; what reaches here is a socket's error.
    func describe(_ error: any Error, during what: String) -> QXferError {
        ChannelErrors.lost(error, during: what)
    }
}

/// A bound QUIC listener: one UDP socket (the endpoint: routing, Retry, version negotiation,
/// stateless resets) handing each admitted connection's driver to the application.
struct QUICListener: BoundTransportListener {
    typealias Accepted = (NIOLoopBound<QUICConnectionDriver>, PeerIdentity, Endpoint?)
    let channel: any Channel
    let accepted: AsyncStream<Accepted>
    let acceptedContinuation: AsyncStream<Accepted>.Continuation
    let port: UInt16

    static func bind<Stack>(_ quic: QUIC, _ request: ListenRequest<Stack>) async throws -> QUICListener {
        let (accepted, continuation) = AsyncStream.makeStream(of: Accepted.self, bufferingPolicy: .bufferingOldest(256))
        let channel: any Channel
        do {
            let identity = try quic.identity ?? HostIdentity.loadOrCreate()
            let parameters = request.parameters
            // Derived from the identity, so a restarted receiver can still tell stale clients
            // that their connection is gone (RFC 9000 section 10.3).
            let secret = identity.statelessResetSecret
            // Tickets from the same identity's secret: a restarted receiver still resumes its senders' sessions.
            let tickets = try QUICSessionTicketIssuer(secret: secret, register: quic.earlyDataRegister)
            let makeConfiguration: @Sendable (_ peerIsLoopback: Bool) -> (QUICConfiguration, PeerVerifier) = { peerIsLoopback in
                let verifier = PeerVerifier(.server(quic.clientAuthentication))
                var configuration = QUICStackConfiguration.make(
                    quic, identity: identity, parameters: parameters, verifier: verifier, isServer: true,
                    peerIsLoopback: peerIsLoopback, resetSecret: secret)
                configuration.sessionTickets = tickets
                return (configuration, verifier)
            }
            let template = makeConfiguration(false).0
            let server = QUICSocketHandler.Server(
                makeConfiguration: makeConfiguration,
                makeConnection: { engine, verifier, eventLoop in
                    let driver = QUICConnectionDriver(
                        engine: engine, eventLoop: eventLoop, verifier: verifier, acceptedProtocols: quic.applicationProtocols)
                    driver.handshakeResult.assumeIsolated().whenSuccess { [unowned driver] _ in
                        let outcome = driver.verifier.result
                        let peer = PeerIdentity(
                            fingerprint: outcome.fingerprint, trust: outcome.trust,
                            applicationProtocol: driver.engine.negotiatedALPN ?? "")
                        let remote = driver.engine.path.remote.socketAddress?.endpoint
                        if case .dropped = continuation.yield((NIOLoopBound(driver, eventLoop: driver.eventLoop), peer, remote)) {
                            driver.close(code: 0x2, reason: "too many pending connections")
                        }
                    }
                    return driver
                },
                statelessResetSecret: secret,
                connectionIDLength: template.connectionIDLength,
                connectionIDPrefix: template.connectionIDPrefix,
                retryAbovePendingHandshakes: request.validateAddressesAbovePendingHandshakes)
            let options = QUICSockets.Options(parameters)
            // No SO_REUSEADDR: on UDP it lets a second socket bind a port already in use (and
            // port 0 hand out one), and the kernel then delivers a client's packets to either.
            let bootstrap = DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try QUICSockets.prepare(channel, options: options, server: server)
                    }
                }
            channel = try await bindEveryAddress(host: request.host) { host in
                try await bootstrap.bind(host: host, port: Int(request.port)).get()
            }
        } catch {
            throw (error as? QXferError)
                ?? QXferError(.bindFailed, "cannot listen on UDP port \(request.port): \(ChannelErrors.reason(error))", underlying: error)
        }
        channel.closeFuture.whenComplete { _ in continuation.finish() }
        return QUICListener(
            channel: channel, accepted: accepted, acceptedContinuation: continuation,
            port: UInt16(channel.localAddress?.port ?? Int(request.port)))
    }

    func run(serving serve: @escaping @Sendable (any ByteStreamTransport, Endpoint?) async -> Void) async throws {
        let channel = self.channel
        let continuation = acceptedContinuation
        await withTaskCancellationHandler {
            await withDiscardingTaskGroup { group in
                for await (driver, peer, remote) in accepted {
                    group.addTask {
                        let stream = driver.eventLoop.flatSubmit { driver.value.primaryStream }
                        await serve(QUICStreamTransport(driver: driver, stream: stream, peer: peer), remote)
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
}
