import Foundation
import Logging
import NIOCore
import NIOPosix
import QUICEngine

/// A QUIC stream seen as a ``ByteStreamTransport``.
///
/// The connection's primary stream (the client's first bidirectional stream) closes the whole
/// connection when closed; any other stream closing resets just itself.
final class QUICStreamTransport: ByteStreamTransport {
    let peer: PeerIdentity
    private let driver: NIOLoopBound<QUICConnectionDriver>
    private let stream: EventLoopFuture<QUICStreamID>
    private let eventLoop: any EventLoop
    private let isPrimary: Bool

    init(driver: NIOLoopBound<QUICConnectionDriver>, stream: EventLoopFuture<QUICStreamID>, peer: PeerIdentity, isPrimary: Bool = true) {
        self.driver = driver
        self.stream = stream
        self.peer = peer
        self.eventLoop = driver.eventLoop
        self.isPrimary = isPrimary
    }

    func write(_ buffer: ByteBuffer) async throws {
        let driver = self.driver
        try await stream.flatMap { driver.value.write(buffer, on: $0) }.get()
    }

    func read() async throws -> [ByteBuffer]? {
        let driver = self.driver
        return try await stream.flatMap { driver.value.read($0) }.get()
    }

    func finish() async throws {
        let driver = self.driver
        try await stream.flatMap { driver.value.finish($0) }.get()
    }

    func reset(errorCode: UInt64) {
        let driver = self.driver
        stream.whenSuccess { driver.value.reset($0, errorCode: errorCode) }
    }

    func close() {
        if isPrimary {
            let driver = self.driver
            eventLoop.execute { driver.value.closeGracefully() }
        } else {
            reset(errorCode: 0)
        }
    }

    func metrics() async -> ConnectionMetrics {
        let driver = self.driver
        return (try? await eventLoop.submit { driver.value.metrics }.get()) ?? ConnectionMetrics()
    }

    var hasEnded: Bool {
        get async {
            let driver = self.driver
            return (try? await eventLoop.submit { driver.value.closeError != nil }.get()) ?? true
        }
    }

    var multiplexer: (any StreamMultiplexer)? { QUICMultiplexer(driver: driver, peer: peer) }

    func exportKeyingMaterial(label: String, context: [UInt8], length: Int) async throws -> [UInt8] {
        let driver = self.driver
        return try await eventLoop.submit {
            do {
                return try driver.value.engine.exportKeyingMaterial(label: label, context: context, length: length)
            } catch {
                throw QXferError(.invalidUse, "cannot export keying material: \(error)")
            }
        }.get()
    }
}

/// A QUIC connection's other streams and its datagrams.
struct QUICMultiplexer: StreamMultiplexer {
    let driver: NIOLoopBound<QUICConnectionDriver>
    let peer: PeerIdentity

    func openStream() async throws -> any ByteStreamTransport {
        let driver = self.driver
        while true {
            let opened = try await driver.eventLoop.submit { try driver.value.openStream() }.get()
            if let id = opened {
                return QUICStreamTransport(
                    driver: driver, stream: driver.eventLoop.makeSucceededFuture(id), peer: peer, isPrimary: false)
            }
            try await driver.eventLoop.flatSubmit { driver.value.streamsAvailable() }.get()
        }
    }

    func acceptStream() async throws -> (any ByteStreamTransport)? {
        let driver = self.driver
        guard let id = try await driver.eventLoop.flatSubmit({ driver.value.acceptStream() }).get() else { return nil }
        return QUICStreamTransport(driver: driver, stream: driver.eventLoop.makeSucceededFuture(id), peer: peer, isPrimary: false)
    }

    func sendDatagram(_ payload: ByteBuffer) async throws {
        let driver = self.driver
        try await driver.eventLoop.submit { try driver.value.sendDatagram(payload) }.get()
    }

    func receiveDatagram() async throws -> ByteBuffer? {
        let driver = self.driver
        return try await driver.eventLoop.flatSubmit { driver.value.receiveDatagram() }.get().map { ByteBuffer(bytes: $0) }
    }

    func migrate(localHost: String?) async throws {
        let driver = self.driver
        let (remoteIsIPv6, trafficClass) = try await driver.eventLoop.submit {
            (driver.value.engine.path.remote.isIPv6, driver.value.trafficClass)
        }.get()
        // The new socket must live on the connection's own event loop: the driver is confined to it.
        let channel = try await QUICTransport.openClientSocket(
            on: driver.eventLoop, host: localHost ?? (remoteIsIPv6 ? "::" : "0.0.0.0"), trafficClass: trafficClass)
        do {
            try await driver.eventLoop.submit {
                let driver = driver.value
                let handler = try channel.pipeline.syncOperations.handler(type: QUICSocketHandler.self)
                guard let local = handler.localAddress else { throw QXferError(.invalidUse, "the new socket has no address") }
                let old = driver.socket
                if let old, let oldHandler = try? old.pipeline.syncOperations.handler(type: QUICSocketHandler.self) {
                    oldHandler.detach(client: driver)
                }
                handler.attach(client: driver)
                do {
                    try driver.engine.migrate(toLocalAddress: local, now: QUICConnectionDriver.now)
                } catch {
                    throw QXferError(.invalidUse, "cannot migrate the connection: \(error)")
                }
                driver.process()
                old?.close(promise: nil)
            }.get()
        } catch {
            try? await channel.close()
            throw error
        }
    }

    func close(errorCode: UInt64, reason: String) {
        let driver = self.driver
        driver.eventLoop.execute { driver.value.closeGracefully(code: errorCode, reason: reason) }
    }

    func maximumDatagramSize() async -> Int? {
        let driver = self.driver
        return (try? await driver.eventLoop.submit { driver.value.engine.maxDatagramPayloadSize }.get()) ?? nil
    }
}

/// Connecting and listening on QUIC.
enum QUICTransport {
    static let logger = Logger(label: "qxfer.quic")

    /// The engine configuration for a stack and its parameters.
    static func configuration<Stack>(
        _ quic: QUIC, identity: HostIdentity, parameters: NetworkParameters<Stack>, verifier: PeerVerifier, isServer: Bool,
        resetSecret: [UInt8]? = nil
    ) -> QUICConfiguration {
        var configuration = QUICConfiguration(
            certificateChainPEM: identity.certificatePEM, privateKeyPEM: identity.privateKeyPEM,
            verifyPeer: { verifier.evaluate(certificateDER: $0) })
        configuration.applicationProtocols = quic.applicationProtocols
        if isServer {
            switch quic.clientAuthentication.kind {
            case .none: configuration.clientAuthentication = .none
            case .optional: configuration.clientAuthentication = .optional
            case .required: configuration.clientAuthentication = .required
            }
        }
        // BBR unless asked otherwise: on loopback the two are within noise of each other
        // (bench/loopback.sh: 352 vs 272 MB/s in one run, 272 vs 314 in another), but under
        // 1 % random loss CUBIC collapses where BBR holds (the brief's TCP figures: 57.6 MB/s
        // against under 0.5), and lossy WAN links are what qxfer is for. Realtime and bulk take
        // BBR v2: ngtcp2's BBR v1 cuts an application-limited flow's window to what is in flight
        // at every loss, which held frames back 17 ms or more after each one (docs/STREAMING.md),
        // and under 1 % random loss on a 50 ms, 500 Mbit/s path it moved a bulk transfer 10-20 %
        // slower than BBR v2 (docs/benchmarks.md, "Why QUIC overshot the emulated WAN").
        let defaultAlgorithm: CongestionControl = parameters.performanceMode == .default ? .bbr : .bbr2
        switch (parameters.congestionControl ?? defaultAlgorithm).name {
        case "bbr": configuration.congestionControl = .bbr
        case "bbr2": configuration.congestionControl = .bbr2
        case "reno": configuration.congestionControl = .reno
        default: configuration.congestionControl = .cubic
        }
        if let idle = parameters.idleTimeout {
            configuration.idleTimeout = idle
        } else {
            // "No idle timeout" on QUIC: keep the path alive, and notice a vanished peer in 30 s.
            configuration.idleTimeout = .seconds(30)
            configuration.keepAliveInterval = .seconds(10)
        }
        if parameters.performanceMode == .bulk { configuration.applyBulkTransferLimits() }
        if let resetSecret {
            configuration.statelessResetSecret = resetSecret
            if isServer { configuration.connectionIDPrefix = connectionIDPrefix(resetSecret: resetSecret) }
        }
        return configuration
    }

    /// The two bytes a listener's connection IDs begin with (``QUICSocketFilter``): derived from
    /// the identity's reset secret, so a restarted receiver still recognizes, and resets, the
    /// connections of its previous run; one-way, so they reveal nothing of the secret.
    static func connectionIDPrefix(resetSecret: [UInt8]) -> [UInt8] {
        let label = QUICConnectionID(Array("qxfer/1 connection-ID prefix".utf8.prefix(20)))!
        return Array(QUICStatelessReset.token(secret: resetSecret, connectionID: label).prefix(2))
    }

    /// Socket options for a QUIC UDP socket: big buffers, GRO, vectored reads, DSCP.
    static func tune(_ channel: any Channel, trafficClass: Int32) throws {
        guard let options = channel.syncOptions else { return }
        try options.setOption(.socketOption(.so_rcvbuf), value: 4 << 20)
        try options.setOption(.socketOption(.so_sndbuf), value: 4 << 20)
        try options.setOption(.writeBufferWaterMark, value: .init(low: 256 << 10, high: 1 << 20))
        try? options.setOption(.datagramReceiveOffload, value: true)
        try? options.setOption(.datagramReceiveSegmentSize, value: true)
        // Vectored reads (recvmmsg) of up to 8 GRO batches; NIO splits one buffer evenly
        // between the messages, so each needs room for a whole 64 KiB batch.
        try options.setOption(.datagramVectorReadMessageCount, value: 8)
        try options.setOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: 8 * 65536))
        if trafficClass != 0 {
            try? options.setOption(ChannelOptions.Types.SocketOption(level: SocketOptionLevel(IPPROTO_IP), name: IP_TOS), value: SocketOptionValue(trafficClass))
            try? options.setOption(ChannelOptions.Types.SocketOption(level: SocketOptionLevel(IPPROTO_IPV6), name: IPV6_TCLASS), value: SocketOptionValue(trafficClass))
        }
    }

    // MARK: Client

    /// A client's UDP socket bound to `host` (any port) on `group`, with its QUIC handler.
    static func openClientSocket(on group: any EventLoopGroup, host: String, trafficClass: Int32) async throws -> any Channel {
        try await bindClientSocket(on: group, host: host, port: 0, trafficClass: trafficClass).get()
    }

    /// A client's UDP socket bound to `host` and `port`, with its QUIC handler.
    static func bindClientSocket(on group: any EventLoopGroup, host: String, port: Int, trafficClass: Int32) -> EventLoopFuture<any Channel> {
        clientBootstrap(on: group, trafficClass: trafficClass).bind(host: host, port: port)
    }

    /// A client's UDP socket bound to `address` (a socket that died, taken again), with its QUIC handler.
    static func bindClientSocket(on group: any EventLoopGroup, to address: SocketAddress, trafficClass: Int32) -> EventLoopFuture<any Channel> {
        clientBootstrap(on: group, trafficClass: trafficClass).bind(to: address)
    }

    private static func clientBootstrap(on group: any EventLoopGroup, trafficClass: Int32) -> DatagramBootstrap {
        DatagramBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try tune(channel, trafficClass: trafficClass)
                    try channel.pipeline.syncOperations.addHandler(QUICSocketHandler(server: nil))
                }
            }
    }

    /// Connects to `endpoint`: resolves it, races its addresses (RFC 8305: IPv6 first,
    /// alternating families, a new attempt every 250 ms until one completes its handshake).
    static func connect<Stack>(
        to endpoint: Endpoint, quic: QUIC, parameters: NetworkParameters<Stack>, timeout: Duration
    ) async throws -> QUICStreamTransport {
        let identity = try quic.identity ?? HostIdentity.loadOrCreate()
        let addresses = try await resolve(endpoint)
        let hostKey = KnownHosts.key(host: endpoint.host, port: Int(endpoint.port))
        let trust = parameters.peerFingerprint.map { PeerTrust.pinned($0) } ?? quic.peerTrust

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
                    let verifier = PeerVerifier(.client(trust, hostKey: hostKey))
                    return (try await attempt(address, quic: quic, identity: identity, parameters: parameters, verifier: verifier, timeout: timeout), verifier)
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
        logger.info("QUIC handshake with \(endpoint) done: ALPN \(transport.peer.applicationProtocol), peer \(transport.peer.fingerprint?.description ?? "-") trusted as \(transport.peer.trust)")
        if let (file, key) = verifier.result.pendingFirstUse, let fingerprint = transport.peer.fingerprint {
            do {
                try file.add(key, fingerprint)
            } catch {
                transport.close()
                throw error
            }
        }
        return transport
    }

    private static func attempt<Stack>(
        _ remote: SocketAddress, quic: QUIC, identity: HostIdentity, parameters: NetworkParameters<Stack>,
        verifier: PeerVerifier, timeout: Duration
    ) async throws -> QUICStreamTransport {
        var configuration = configuration(quic, identity: identity, parameters: parameters, verifier: verifier, isServer: false)
        configuration.handshakeTimeout = min(timeout, .seconds(10))
        let trafficClass = parameters.serviceClass.trafficClass
        let channel: any Channel
        do {
            channel = try await openClientSocket(
                on: MultiThreadedEventLoopGroup.singleton, host: remote.protocol == .inet6 ? "::" : "0.0.0.0", trafficClass: trafficClass)
        } catch {
            throw QXferError(.connectFailed, "cannot open a UDP socket: \(ChannelErrors.reason(error))", underlying: error)
        }
        let setup = channel.eventLoop.submit { () throws -> (NIOLoopBound<QUICConnectionDriver>, EventLoopFuture<String>) in
            let handler = try channel.pipeline.syncOperations.handler(type: QUICSocketHandler.self)
            guard let local = handler.localAddress, let remoteAddress = QUICSocketAddress(remote) else {
                throw QXferError(.connectFailed, "cannot use the address \(remote)")
            }
            let engine = try QUICConnection(clientWith: configuration, path: QUICPath(local: local, remote: remoteAddress), now: QUICConnectionDriver.now)
            let driver = QUICConnectionDriver(engine: engine, eventLoop: channel.eventLoop, verifier: verifier, acceptedProtocols: quic.applicationProtocols)
            driver.trafficClass = trafficClass
            handler.attach(client: driver)
            driver.process()
            return (NIOLoopBound(driver, eventLoop: channel.eventLoop), driver.handshake.futureResult)
        }
        let driver: NIOLoopBound<QUICConnectionDriver>
        let alpn: String
        do {
            let (bound, handshake) = try await setup.get()
            driver = bound
            alpn = try await withTaskCancellationHandler {
                try await handshake.get()
            } onCancel: {
                channel.eventLoop.execute { bound.value.close() }
            }
        } catch {
            channel.close(promise: nil)
            if let failure = verifier.result.failure { throw failure }
            if Task.isCancelled { throw CancellationError() }
            if let reason = noRoute(to: remote) {
                let address = Endpoint.hostPort(host: remote.ipAddress ?? "?", port: UInt16(remote.port ?? 0))
                throw QXferError(.connectFailed, "cannot reach \(address): \(reason)", underlying: error)
            }
            throw (error as? QXferError) ?? QUICErrors.describe(error)
        }
        if Task.isCancelled {
            channel.eventLoop.execute { driver.value.close() }
            throw CancellationError()
        }
        let stream = try await channel.eventLoop.submit { () throws -> QUICStreamID in
            guard let id = try driver.value.openStream() else {
                throw QXferError(.handshakeFailed, "the peer allows no streams")
            }
            return id
        }.get()
        let outcome = verifier.result
        let peer = PeerIdentity(fingerprint: outcome.fingerprint, trust: outcome.trust, applicationProtocol: alpn)
        return QUICStreamTransport(driver: driver, stream: channel.eventLoop.makeSucceededFuture(stream), peer: peer)
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

    /// Resolves a host name into addresses ordered for racing: IPv6 and IPv4 alternating,
    /// IPv6 first (RFC 8305 section 4).
    static func resolve(_ endpoint: Endpoint) async throws -> [SocketAddress] {
        let host = endpoint.host
        let port = Int(endpoint.port)
        if let literal = try? SocketAddress(ipAddress: host, port: port) { return [literal] }
        let found: [SocketAddress] = try await NIOThreadPool.singleton.runIfActive {
            var hints = addrinfo()
            hints.ai_socktype = Int32(SOCK_DGRAM.rawValue)
            var list: UnsafeMutablePointer<addrinfo>?
            let status = getaddrinfo(host, String(port), &hints, &list)
            guard status == 0, let list else {
                throw QXferError(.connectFailed, "cannot resolve \(host): \(String(cString: gai_strerror(status)))")
            }
            defer { freeaddrinfo(list) }
            var addresses: [SocketAddress] = []
            var cursor: UnsafeMutablePointer<addrinfo>? = list
            while let entry = cursor {
                if let address = entry.pointee.ai_addr {
                    switch entry.pointee.ai_family {
                    case AF_INET:
                        address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { addresses.append(SocketAddress($0.pointee, host: host)) }
                    case AF_INET6:
                        address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { addresses.append(SocketAddress($0.pointee, host: host)) }
                    default: break
                    }
                }
                cursor = entry.pointee.ai_next
            }
            return addresses
        }
        var v6 = found.filter { $0.protocol == .inet6 }.makeIterator()
        var v4 = found.filter { $0.protocol == .inet }.makeIterator()
        var ordered: [SocketAddress] = []
        while true {
            let a = v6.next(), b = v4.next()
            if a == nil && b == nil { break }
            if let a, !ordered.contains(a) { ordered.append(a) }
            if let b, !ordered.contains(b) { ordered.append(b) }
        }
        guard !ordered.isEmpty else { throw QXferError(.connectFailed, "\(host) has no address") }
        return ordered
    }
}
