import enum LinuxSystem.UsableMemory
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
///
/// NIO closes a UDP socket when a send fails with an error it does not expect from one
/// datagram (EPERM when a local firewall or a full connection-tracking table drops the
/// packet, ENETUNREACH): the listener then binds the same port again, so one refused packet
/// does not end QUIC for the receiver's whole run (the connections on the old socket end).
struct QUICListener: BoundTransportListener {
    typealias Accepted = (NIOLoopBound<QUICConnectionDriver>, PeerIdentity, Endpoint?)
    let accepted: AsyncStream<Accepted>
    let acceptedContinuation: AsyncStream<Accepted>.Continuation
    let port: UInt16
    /// The socket in use, and whether the listener is stopping (then a closed socket stays closed).
    private let socket: Locked<SocketState>

    private struct SocketState {
        var channel: any Channel
        var stopping = false
        /// When a socket was last bound again, and how many closes came each soon after the
        /// one before: while a block lasts, every packet refused closes the new socket too.
        var reopened: ContinuousClock.Instant?
        var closesInARow = 0
    }
    /// Binds a new socket on the listener's address and port.
    private let reopen: @Sendable () async throws -> any Channel

    static func bind<Stack>(_ quic: QUIC, _ request: ListenRequest<Stack>) async throws -> QUICListener {
        let (accepted, continuation) = AsyncStream.makeStream(of: Accepted.self, bufferingPolicy: .bufferingOldest(256))
        let channel: any Channel
        let open: @Sendable (Int) async throws -> any Channel
        do {
            let identity = try quic.identity ?? HostIdentity.loadOrCreate()
            let parameters = request.parameters
            // Derived from the identity, so a restarted receiver can still tell stale clients
            // that their connection is gone (RFC 9000 section 10.3).
            let secret = identity.statelessResetSecret
            // Tickets from the same identity's secret: a restarted receiver still resumes its senders' sessions.
            let tickets = try QUICSessionTicketIssuer(secret: secret, register: quic.earlyDataRegister)
            let refused = request.refused
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
                    driver.handshakeResult.assumeIsolated().whenFailure { [unowned driver] _ in
                        // Its certificate refused (a verdict, not a lost handshake).
                        let outcome = driver.verifier.result
                        guard let failure = outcome.failure, outcome.fingerprint != nil else { return }
                        let remote = driver.engine.path.remote.socketAddress?.endpoint
                        refused(RefusedClient(address: remote, fingerprint: outcome.fingerprint, reason: failure))
                    }
                    return driver
                },
                statelessResetSecret: secret,
                connectionIDLength: template.connectionIDLength,
                connectionIDPrefix: template.connectionIDPrefix,
                retryAbovePendingHandshakes: request.validateAddressesAbovePendingHandshakes,
                receiveWindows: ReceiveWindowBudget(bytes: UInt64(max(0, quic.receiveWindowBudget ?? UsableMemory.share(1, of: 8, atLeast: 64 << 20, atMost: 2 << 30)))))
            let options = QUICSockets.Options(parameters)
            open = { port in
                // No SO_REUSEADDR: on UDP it lets a second socket bind a port already in use (and
                // port 0 hand out one), and the kernel then delivers a client's packets to either.
                let bootstrap = DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .channelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            try QUICSockets.prepare(channel, options: options, server: server)
                        }
                    }
                return try await bindEveryAddress(host: request.host) { host in
                    try await bootstrap.bind(host: host, port: port).get()
                }
            }
            channel = try await open(Int(request.port))
        } catch {
            throw (error as? QXferError)
                ?? QXferError(.bindFailed, "cannot listen on \(request.host.map { "\($0) " } ?? "")UDP port \(request.port): \(ChannelErrors.reason(error))", underlying: error)
        }
        let port = channel.localAddress?.port ?? Int(request.port)
        let listener = QUICListener(
            accepted: accepted, acceptedContinuation: continuation, port: UInt16(port),
            socket: Locked(SocketState(channel: channel)), reopen: { try await open(port) })
        listener.watch(channel)
        return listener
    }

    /// When `channel` closes: the end if the listener is stopping, else a new socket.
    private func watch(_ channel: any Channel) {
        channel.closeFuture.whenComplete { _ in
            let (stopping, closes) = socket.withLock { state in
                let soonAfter = state.reopened.map { ContinuousClock.now - $0 < .seconds(60) } ?? false
                state.closesInARow = soonAfter ? state.closesInARow + 1 : 1
                return (state.stopping, state.closesInARow)
            }
            guard !stopping else { return acceptedContinuation.finish() }
            // Said once, then at 2, 4, 8… closes in a row: a lasting block does not flood the log.
            if closes == 1 {
                QUICConnector.logger.warning("the QUIC socket on UDP port \(port) was closed under the listener; listening again")
            } else if closes & (closes - 1) == 0 {
                QUICConnector.logger.warning("the QUIC socket on UDP port \(port) was closed again, \(closes) times in a row (this host refuses its sends); listening again")
            }
            Task { await listenAgain() }
        }
    }

    /// Binds the port again, retrying with backoff (another program may hold it for a while),
    /// until it succeeds or the listener stops.
    private func listenAgain() async {
        var delay = Duration.milliseconds(100)
        while !socket.withLock({ $0.stopping }) {
            try? await Task.sleep(for: delay)
            do {
                let channel = try await reopen()
                let stopped = socket.withLock { state in
                    if !state.stopping { state.channel = channel }
                    state.reopened = .now
                    return state.stopping
                }
                if stopped {
                    try? await channel.close()
                    return acceptedContinuation.finish()
                }
                watch(channel)
                return
            } catch {
                QUICConnector.logger.warning("cannot listen on UDP port \(port) again: \(ChannelErrors.reason(error)); retrying")
                delay = min(delay * 2, .seconds(5))
            }
        }
        acceptedContinuation.finish()
    }

    func run(serving serve: @escaping @Sendable (any ByteStreamTransport, Endpoint?) async -> Void) async throws {
        let socket = self.socket
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
            let channel = socket.withLock { state in
                state.stopping = true
                return state.channel
            }
            channel.eventLoop.execute {
                (try? channel.pipeline.syncOperations.handler(type: QUICSocketHandler.self))?.shutdown()
                continuation.finish()
            }
        }
        try? await socket.withLock { $0.channel }.close()
    }
}
