import Logging
import NIOCore
import NIOPosix
import QUICEngine
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity
@_spi(Stacks) import QXferSockets

/// Connecting on QUIC: the address race (RFC 8305), one handshake per address.
enum QUICConnector {
    static let logger = Logger(label: "qxfer.quic")

    /// Connects to `endpoint`: resolves it, races its addresses (RFC 8305: IPv6 first,
    /// alternating families, a new attempt every 250 ms until one completes its handshake).
    static func connect<Stack>(
        to endpoint: Endpoint, quic: QUIC, parameters: NetworkParameters<Stack>, timeout: Duration,
        peerAnswered: @escaping @Sendable () -> Void = {}
    ) async throws -> QUICStreamTransport {
        let identity = try quic.identity ?? HostIdentity.loadOrCreate()
        let resolved = try await resolve(endpoint)
        // Several addresses and the path probe may each hear the peer: the caller hears it once.
        let heard = Locked(false)
        let peerAnswered: @Sendable () -> Void = {
            if !heard.withLock({ heard in defer { heard = true }; return heard }) { peerAnswered() }
        }
        let resumption = quic.sessionTickets.map { store in
            let stored = store.entry(for: endpoint)
            // Saved beside the event loop: a file write there held up the receiver's answer that came with the ticket.
            return Resumption(
                ticket: stored?.ticket, fingerprint: stored?.fingerprint, address: stored?.address,
                keep: { ticket, fingerprint, address in store.saveSoon(ticket, for: endpoint, fingerprint: fingerprint, address: address) },
                forget: { store.save(nil, for: endpoint) })
        }
        // Early data goes to the first address alone (its connection is handed over before the
        // handshake): the one the ticket came over, while the name still resolves to it.
        let addresses = Self.leading(resolved, with: resumption?.address)

        let winner: (QUICStreamTransport, PeerVerifier) = try await withThrowingTaskGroup(of: (QUICStreamTransport, PeerVerifier)?.self) { group in
            var lastError: (any Error)?
            var next = 0
            var running = 0
            func startNext() {
                guard next < addresses.count else { return }
                let address = addresses[next]
                next += 1
                running += 1
                logger.info("QUIC handshake with \(endpoint) at \(address)")
                group.addTask {
                    let verifier = clientVerifier(for: endpoint, quic: quic, parameters: parameters)
                    let transport = try await attempt(
                        address, of: endpoint, quic: quic, identity: identity, parameters: parameters, verifier: verifier, timeout: timeout,
                        resumption: resumption, othersToTry: addresses.count > 1, peerAnswered: peerAnswered)
                    return (transport, verifier)
                }
                group.addTask {  // the stagger timer: nil result means "start the next one"
                    try? await Task.sleep(for: .milliseconds(250))
                    return nil
                }
            }
            startNext()
            while let result = await group.nextResult() {
                switch result {
                case .success(let won?):
                    group.cancelAll()
                    // Losers that completed anyway are closed by their own tasks' cancellation.
                    return won
                case .success(nil):
                    startNext()
                case .failure(let error):
                    running -= 1
                    lastError = error
                    if let qxfer = error as? QXferError, qxfer.code != .connectFailed { group.cancelAll(); throw qxfer }
                    startNext()
                }
                if running == 0 && next >= addresses.count {
                    group.cancelAll()
                    throw lastError ?? QXferError(.connectFailed, "cannot connect to \(endpoint)")
                }
            }
            throw lastError ?? QXferError(.connectFailed, "cannot connect to \(endpoint)")
        }
        let (transport, verifier) = winner
        let checked = verifier.result
        if checked.fingerprint != nil, checked.failure == nil {
            logger.info("QUIC connection to \(endpoint) ready: ALPN \(transport.peer.applicationProtocol), peer \(checked.fingerprint?.description ?? "-") trusted as \(checked.trust)")
        } else {
            // Early data: the ticket names the receiver, but its certificate is checked only as
            // the handshake completes; trust is logged then (earlyTransport), not before.
            logger.info("QUIC connection to \(endpoint) open for early data: ALPN \(transport.peer.applicationProtocol), the receiver's identity not yet checked")
        }
        do {
            try verifier.recordAfterHandshake(peer: transport.peer.fingerprint)
        } catch {
            transport.close()
            throw error
        }
        return transport
    }

    /// How long an early connection to one of several addresses waits for its first answer.
    static let earlyAnswerDeadline = Duration.seconds(1)

    /// `addresses` with the one whose numeric form is `remembered` moved to the front.
    static func leading(_ addresses: [SocketAddress], with remembered: String?) -> [SocketAddress] {
        guard let remembered, let index = addresses.firstIndex(where: { $0.ipAddress == remembered }), index > 0 else { return addresses }
        var ordered = addresses
        ordered.insert(ordered.remove(at: index), at: 0)
        return ordered
    }

    private static func attempt<Stack>(
        _ remote: SocketAddress, of endpoint: Endpoint, quic: QUIC, identity: HostIdentity, parameters: NetworkParameters<Stack>,
        verifier: PeerVerifier, timeout: Duration, resumption: Resumption?, othersToTry: Bool, peerAnswered: @escaping @Sendable () -> Void
    ) async throws -> QUICStreamTransport {
        let remoteAddress = QUICSocketAddress(remote)
        let shown = remote.endpoint?.description ?? "\(remote)"
        var configuration = QUICStackConfiguration.make(
            quic, identity: identity, parameters: parameters, verifier: verifier, isServer: false,
            peerIsLoopback: remoteAddress?.isLoopback == true)
        let started = ContinuousClock.now
        if let resumption {
            configuration.resumption = resumption.ticket
            configuration.sessionTicketReceiver = { ticket in resumption.keep(ticket, verifier.result.fingerprint, remote.ipAddress) }
        }
        if parameters.performanceMode == .bulk, quic.probesPathMTU, remoteAddress?.isLoopback == false || !quic.loopbackIsThisHost,
           let size = await PathMTUProbe.largestDatagram(to: remote, within: timeout / 4, answered: peerAnswered) {
            configuration.maxUDPPayloadSize = size
            logger.info("QUIC datagrams of \(size) bytes reach \(remote)")
        }
        try Task.checkCancellation()
        // The probe's time counts against the attempt's.
        configuration.handshakeTimeout = min(timeout - (ContinuousClock.now - started), .seconds(10))
        let socketOptions = QUICSockets.Options(parameters)
        let channel: any Channel
        do {
            channel = try await QUICSockets.openClientSocket(
                on: MultiThreadedEventLoopGroup.singleton, host: QUICSockets.wildcardHost(ipv6: remote.protocol == .inet6), options: socketOptions)
        } catch {
            throw QXferError(.connectFailed, "cannot open a UDP socket: \(ChannelErrors.reason(error))", underlying: error)
        }
        let early = earlyPeer(quic: quic, verifier: verifier, ticket: resumption?.ticket, fingerprint: resumption?.fingerprint)
        let setup = channel.eventLoop.submit { [configuration, remoteAddress] () throws -> (NIOLoopBound<QUICConnectionDriver>, EventLoopFuture<String>, QUICStreamID?) in
            let handler = try channel.pipeline.syncOperations.handler(type: QUICSocketHandler.self)
            guard let local = handler.localAddress, let remoteAddress else {
                throw QXferError(.connectFailed, "cannot use the address \(remote)")
            }
            let engine = try Resumption.makeEngine(configuration, path: QUICPath(local: local, remote: remoteAddress), resumption)
            let driver = QUICConnectionDriver(engine: engine, eventLoop: channel.eventLoop, verifier: verifier, acceptedProtocols: quic.applicationProtocols)
            driver.socketOptions = socketOptions
            driver.peerAnswered = peerAnswered
            handler.attach(client: driver)
            let bound = NIOLoopBound(driver, eventLoop: channel.eventLoop)
            UDPRefusalWatch.watch(
                remote, on: channel.eventLoop, until: driver.handshake.futureResult, unanswered: { !bound.value.heardFromPeer }
            ) { code in
                bound.value.refused(with: QXferError(.connectFailed, "cannot connect to \(shown) over UDP: \(String(cString: strerror(code)))"))
            }
            // The early stream opens before the first packet leaves, while the engine still
            // holds its 0-RTT keys unused (on a LAN the answer may come before the next turn).
            let firstStream = early != nil ? try earlyStream(of: driver) : nil
            if firstStream != nil {
                driver.earlyTo = endpoint
                // Early data goes to this address alone, where the race would have tried the
                // next after 250 ms: an address silent this long fails the connection, and the
                // program connects again, racing them (EarlyDataUnanswered).
                if othersToTry {
                    let silence = channel.eventLoop.scheduleTask(in: .nanoseconds(Int64(earlyAnswerDeadline.quicNanoseconds))) {
                        bound.value.refused(with: QXferError(.connectFailed, "no answer from \(shown) within \(earlyAnswerDeadline) to early data"))
                    }
                    driver.handshake.futureResult.whenComplete { _ in silence.cancel() }
                }
            }
            driver.process()
            return (bound, driver.handshake.futureResult, firstStream)
        }
        let driver: NIOLoopBound<QUICConnectionDriver>
        let alpn: String
        do {
            let (bound, handshake, earlyStream) = try await setup.get()
            if let early, let earlyStream, let resumption {
                return earlyTransport(bound, handshake, stream: earlyStream, peer: early, verifier: verifier, resumption: resumption)
            }
            driver = bound
            alpn = try await withTaskCancellationHandler {
                try await handshake.get()
            } onCancel: {
                channel.eventLoop.execute { bound.value.close() }
            }
        } catch {
            channel.close(promise: nil)
            // A ticket the handshake failed with (remembered limits the receiver no longer
            // grants, a receiver that changed) is not offered again: the next try starts afresh.
            if resumption?.ticket != nil && !Task.isCancelled { resumption?.forget() }
            if let failure = verifier.result.failure { throw failure }
            if Task.isCancelled { throw CancellationError() }
            if let reason = noRoute(to: remote) {
                throw QXferError(.connectFailed, "cannot reach \(shown): \(reason)", underlying: error)
            }
            throw (error as? QXferError) ?? QUICErrors.describe(error)
        }
        if Task.isCancelled {
            channel.eventLoop.execute { driver.value.close() }
            throw CancellationError()
        }
        let (stream, resumed) = try await channel.eventLoop.submit { () throws -> (QUICStreamID, Bool) in
            guard let id = try driver.value.openStream() else {
                throw QXferError(.handshakeFailed, "the peer allows no streams")
            }
            return (id, driver.value.engine.isResumed)
        }.get()
        if resumption?.ticket != nil { logger.info("QUIC session \(resumed ? "resumed" : "not resumed: the receiver refused its ticket")") }
        let outcome = verifier.result
        let peer = PeerIdentity(fingerprint: outcome.fingerprint, trust: outcome.trust, applicationProtocol: alpn)
        return QUICStreamTransport(driver: driver, stream: channel.eventLoop.makeSucceededFuture(stream), peer: peer)
    }

    /// How a client judges the receiver at `endpoint`: the connection's pin, else the stack's trust.
    private static func clientVerifier<Stack>(for endpoint: Endpoint, quic: QUIC, parameters: NetworkParameters<Stack>) -> PeerVerifier {
        let trust = parameters.peerFingerprint.map { PeerTrust.pinned($0) } ?? quic.peerTrust
        return PeerVerifier(.client(trust, hostKey: KnownHosts.key(host: endpoint.host, port: Int(endpoint.port))))
    }

    /// Whether a connection to `endpoint` would send early: ``earlyPeer(quic:verifier:ticket:fingerprint:)``'s
    /// rules for the stored ticket, asked before any socket is opened (a ticket whose limits
    /// allow no early stream still makes the connection wait for its handshake). Not a bulk
    /// connection that probes the path first: the probe costs the round trip early data would
    /// save, and a race's leader, given a second for everything, would leave it a quarter of that.
    static func sendsEarly<Stack>(to endpoint: Endpoint, quic: QUIC, parameters: NetworkParameters<Stack>) -> Bool {
        guard !(parameters.performanceMode == .bulk && quic.probesPathMTU), let stored = quic.sessionTickets?.entry(for: endpoint) else {
            return false
        }
        let verifier = clientVerifier(for: endpoint, quic: quic, parameters: parameters)
        return earlyPeer(quic: quic, verifier: verifier, ticket: stored.ticket, fingerprint: stored.fingerprint) != nil
    }

    /// Who the receiver is, when this connection may hand its first bytes over as early data
    /// (``QUIC/sendsEarlyData``): it resumes with a ticket kept with the fingerprint of a
    /// receiver this client trusts now (pin, known_hosts, pairing; never a first contact).
    /// The certificate sealed in the session is checked against the trust again when the
    /// handshake completes, and a refusal fails the connection. nil: wait for the handshake.
    private static func earlyPeer(quic: QUIC, verifier: PeerVerifier, ticket: QUICSessionTicket?, fingerprint: Fingerprint?) -> PeerIdentity? {
        guard quic.sendsEarlyData, quic.applicationProtocols.count == 1, ticket != nil else { return nil }
        guard let fingerprint, let trust = verifier.presumedTrust(for: fingerprint) else {
            logger.info("QUIC sends nothing early: the ticket's receiver is not one this host trusts by pin, known_hosts or pairing")
            return nil
        }
        return PeerIdentity(fingerprint: fingerprint, trust: trust, applicationProtocol: quic.applicationProtocols[0])
    }

    /// The stream the program's first bytes go on as 0-RTT, or nil if the ticket allows none.
    private static func earlyStream(of driver: QUICConnectionDriver) throws -> QUICStreamID? {
        guard driver.engine.earlyData == .attempted else {
            logger.info("QUIC sends nothing early: the ticket carries no usable limits for early data")
            return nil
        }
        guard let stream = try driver.openStream() else {
            logger.info("QUIC sends nothing early: the ticket's limits allow no stream")
            return nil
        }
        return stream
    }

    /// The connection before its handshake completes, its first stream open: what the program
    /// writes first travels as 0-RTT.
    private static func earlyTransport(
        _ driver: NIOLoopBound<QUICConnectionDriver>, _ handshake: EventLoopFuture<String>, stream: QUICStreamID,
        peer: PeerIdentity, verifier: PeerVerifier, resumption: Resumption
    ) -> QUICStreamTransport {
        handshake.whenComplete { result in
            switch result {
            case .success:
                let engine = driver.value.engine
                let outcome = !engine.isResumed ? "the receiver refused the ticket; the early bytes went again after a full handshake"
                    : engine.earlyData == .accepted ? "the receiver took the early data"
                    : "the receiver refused the early data; the bytes went again"
                let checked = verifier.result
                logger.info("QUIC handshake after early data done: peer \(checked.fingerprint?.description ?? "-") trusted as \(checked.trust); \(outcome)")
            case .failure(let error):
                // As a failed handshake with a ticket: the next connection starts afresh.
                resumption.forget()
                logger.info("QUIC handshake after early data failed: \(verifier.result.failure?.message ?? "\(error)")")
            }
        }
        logger.info("QUIC sends its first bytes as early data (resuming with the ticket of \(peer.fingerprint?.description ?? "-"))")
        return QUICStreamTransport(driver: driver, stream: driver.eventLoop.makeSucceededFuture(stream), peer: peer)
    }

    /// Why the kernel has no route to `remote` ("Network is unreachable"), or nil if it has one:
    /// a failed send closes the socket, and the reason is worth more than "socket closed".
    static func noRoute(to remote: SocketAddress) -> String? {
        let descriptor = socket(Int32(remote.protocol.rawValue), Int32(SOCK_DGRAM.rawValue), 0)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        let failed = remote.withSockAddr { Glibc.connect(descriptor, $0, socklen_t($1)) } != 0
        return failed && [ENETUNREACH, EHOSTUNREACH, EADDRNOTAVAIL].contains(errno) ? String(cString: strerror(errno)) : nil
    }
}

#if canImport(Glibc)
import Glibc
#endif
