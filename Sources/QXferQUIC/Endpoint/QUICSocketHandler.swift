import Logging
import NIOCore
import QUICEngine
@_spi(Stacks) import QXferIdentity

#if canImport(Glibc)
import Glibc
#endif

/// One UDP socket carrying QUIC: splits GRO batches into datagrams, routes them to
/// connections by destination connection ID, accepts new connections (server), answers
/// unknown versions, and sends GSO batches. A bulk transfer's socket paces its own reads on a
/// long path (``ReadCoalescing``).
final class QUICSocketHandler: ChannelDuplexHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    typealias OutboundIn = AddressedEnvelope<ByteBuffer>
    typealias OutboundOut = AddressedEnvelope<ByteBuffer>

    /// What a listening socket needs to accept connections.
    struct Server: Sendable {
        /// A configuration (with a fresh verifier) for each new connection.
        var makeConfiguration: @Sendable (_ peerIsLoopback: Bool) -> (QUICConfiguration, PeerVerifier)
        /// The connection (its driver) for a new client's engine, on the socket's event loop.
        /// It reports itself to the listener once its handshake completes.
        var makeConnection: @Sendable (QUICConnection, PeerVerifier, any EventLoop) -> any QUICEndpointConnection
        /// Connections beyond this many are ignored until others end.
        var maximumConnections = 4096
        /// The secret stateless-reset tokens derive from (the engines use the same one).
        var statelessResetSecret: [UInt8]
        /// The length of the connection IDs the engines issue: short headers do not carry it.
        var connectionIDLength: Int
        /// The bytes the engines' connection IDs begin with: a short header without them was
        /// never addressed to this listener (the kernel filter drops it before it is read).
        var connectionIDPrefix: [UInt8] = []
        /// With this many connections still in their handshake, or twice as many begun in the
        /// current second, a new client must first prove its address with a Retry round trip,
        /// so a flood of spoofed Initials costs the listener a stateless answer instead of a
        /// connection set-up each. 0: always.
        var retryAbovePendingHandshakes = 32
        /// The listener's connection receive windows, shared by its sockets.
        var receiveWindows: ReceiveWindowBudget
    }

    private static let logger = Logger(label: "qxfer.quic")

    /// Seals Retry tokens; they live seconds, so a secret per socket is enough.
    private let retrySecret: [UInt8] = (0..<32).map { _ in UInt8.random(in: 0...255) }
    /// Accepted connections whose handshake has not finished yet.
    private(set) var pendingHandshakes = 0
    /// Connections begun in the current second (undecryptable Initials end at once, so
    /// pending handshakes alone would not notice a flood of them).
    private var acceptedThisSecond = 0
    private var acceptSecond: UInt64 = 0
    /// Retry packets sent, for tests and logs.
    private(set) var retriesSent = 0

    /// Answers sent without any connection state (stateless resets, Retries, Version
    /// Negotiation) are capped per second, so that spoofed traffic cannot turn the listener
    /// into a reflector or busy it.
    struct AnswerBudget {
        let perSecond: Int
        private var second: UInt64 = 0
        private var remaining = 0

        init(perSecond: Int) { self.perSecond = perSecond }

        mutating func spend(now: QUICTime) -> Bool {
            guard hasRoom(now: now) else { return false }
            remaining -= 1
            return true
        }

        /// Whether ``spend(now:)`` would succeed, spending nothing: checked before a source's
        /// own budget, so that a datagram dropped here costs that source nothing either.
        mutating func hasRoom(now: QUICTime) -> Bool {
            let current = now.nanoseconds / 1_000_000_000
            if current != second {
                second = current
                remaining = perSecond
            }
            return remaining > 0
        }
    }
    static let resetsPerSecond = 100
    static let retriesPerSecond = 2000
    static let versionNegotiationsPerSecond = 100
    private var resetBudget = AnswerBudget(perSecond: resetsPerSecond)
    private var retryBudget = AnswerBudget(perSecond: retriesPerSecond)
    private var versionNegotiationBudget = AnswerBudget(perSecond: versionNegotiationsPerSecond)
    /// Each source's share of the work above and of connection set-ups, checked first, so one
    /// address flooding cannot spend the listener-wide budgets other clients need. Generous
    /// enough for a few hundred connections from one host at once (a NAT, `faults.sh` §4).
    static let sourceBurst = 256
    static let sourcePerSecond = 128
    private var sourceBudgets = SourceBudgets(perSecond: sourcePerSecond, burst: sourceBurst)

    private let server: Server?
    private var context: ChannelHandlerContext?
    private(set) var localAddress: QUICSocketAddress?
    private var routes: [QUICConnectionID: any QUICEndpointConnection] = [:]
    private var drivers: [ObjectIdentifier: any QUICEndpointConnection] = [:]
    /// The receive window each accepted connection took from ``Server/receiveWindows``.
    private var windowGrants: [ObjectIdentifier: UInt64] = [:]
    private var dirty: [ObjectIdentifier: any QUICEndpointConnection] = [:]
    /// The connection marked dirty last: a GRO batch's datagrams nearly always go to one, and
    /// marking it once spares a dictionary update per datagram.
    private var lastDirty: ObjectIdentifier?
    private var needsFlush = false
    /// A send buffer a connection did not fill (it had nothing to send), for the next send.
    private var unusedSendBuffer: ByteBuffer?
    /// The connection of a client socket, which has exactly one.
    private var clientDriver: (any QUICEndpointConnection)?
    /// When to read again after a small read; nil: at once, always (not a bulk transfer's socket).
    private var readCoalescing: ReadCoalescing?
    /// The read a pause put off, due when the pause ends.
    private var pausedRead: Scheduled<Void>?
    /// The last destination a batch went to, as NIO takes it: converting it costs a string
    /// formatted and parsed, and nearly every batch goes where the one before went.
    private var lastDestination: (QUICSocketAddress, SocketAddress)?

    /// A listening socket with `server`, or a client's socket with nil. With `coalescesReads`
    /// (bulk transfers) the socket pauses briefly after a small read (``ReadCoalescing``).
    init(server: Server?, coalescesReads: Bool = false) {
        self.server = server
        self.readCoalescing = coalescesReads ? ReadCoalescing(busyReadMessages: QUICSockets.messagesPerRead) : nil
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        updateLocalAddress()
        if let server {
            let program = QUICSocketFilter.program(
                connectionIDLength: server.connectionIDLength, prefix: server.connectionIDPrefix,
                versions: QUICVersionNegotiation.supportedVersions)
            // Without the filter (a kernel refusing it) the handler drops the same datagrams itself.
            QUICSocketFilter.attach(program, to: context.channel).whenFailure { error in
                Self.logger.debug("no kernel filter on the QUIC listener: \(error)")
            }
        }
    }

    func channelActive(context: ChannelHandlerContext) {
        updateLocalAddress()
        context.fireChannelActive()
    }

    private func updateLocalAddress() {
        localAddress = context?.channel.localAddress.flatMap(QUICSocketAddress.init)
    }

    /// The socket.
    var channel: (any Channel)? { context?.channel }

    /// Attaches a client connection to this socket.
    func attach(client driver: any QUICEndpointConnection) {
        clientDriver = driver
        wire(driver)
    }

    /// Lets go of a client connection that moves to another socket, so closing this one does
    /// not end it.
    func detach(client driver: any QUICEndpointConnection) {
        guard clientDriver === driver else { return }
        clientDriver = nil
        drivers[ObjectIdentifier(driver)] = nil
        dirty[ObjectIdentifier(driver)] = nil
        lastDirty = nil
        routes.removeAll()
    }

    private func wire(_ driver: any QUICEndpointConnection) {
        let key = ObjectIdentifier(driver)
        drivers[key] = driver
        driver.endpoint = self
        for id in driver.engine.sourceConnectionIDs { routes[id] = driver }
    }

    // MARK: Called by the connections it carries

    /// Routes datagrams addressed to `id` to `driver` (a connection ID it issued).
    func route(_ id: QUICConnectionID, to driver: any QUICEndpointConnection) {
        routes[id] = driver
    }

    /// Stops routing `id` to `driver` (a connection ID it retired).
    func unroute(_ id: QUICConnectionID, from driver: any QUICEndpointConnection) {
        if routes[id] === driver { routes[id] = nil }
    }

    /// Forgets a terminated connection; a client's socket, which has only that one, closes.
    func forget(_ driver: any QUICEndpointConnection) {
        drivers[ObjectIdentifier(driver)] = nil
        if let window = windowGrants.removeValue(forKey: ObjectIdentifier(driver)) { server?.receiveWindows.giveBack(window) }
        dirty[ObjectIdentifier(driver)] = nil
        lastDirty = nil
        routes = routes.filter { $0.value !== driver }
        if server == nil { context?.close(promise: nil) }
    }

    // MARK: Receive

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        guard let remote = QUICSocketAddress(envelope.remoteAddress), let local = localAddress else { return }
        let path = QUICPath(local: local, remote: remote)
        let total = envelope.data.readableBytes
        let segment = max(envelope.metadata?.segmentSize ?? total, 1)
        readCoalescing?.receivedMessage()
        // One clock read per read message: its datagrams arrived together (GRO).
        let now = QUICClock.now
        envelope.data.withUnsafeReadableBytes { all in
            var offset = 0
            while offset < all.count {
                let length = min(segment, all.count - offset)
                handle(UnsafeRawBufferPointer(rebasing: all[offset..<(offset + length)]), path: path, now: now)
                offset += length
            }
        }
        // Answer after each message (a GRO batch of up to 64 KiB), not only after the whole
        // vectored read: acknowledging once per read (8 messages, about 350 packets) held back
        // a sender whose congestion window was smaller than that. On a long path single datagrams
        // are answered together at the read's end (``ReadCoalescing``).
        if readCoalescing?.longPath != true || total > segment { processReceived() }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        processReceived()
        context.fireChannelReadComplete()
    }

    /// Beyond this many connections a socket never pauses its reads.
    static let mostConnectionsToPauseFor = 64

    /// The channel would read again: at once, or after a pause (``ReadCoalescing``).
    func read(context: ChannelHandlerContext) {
        guard var coalescing = readCoalescing else { return context.read() }
        let pause = coalescing.pauseBeforeNextRead(smallestRoundTrip: smallestRoundTrip)
        readCoalescing = coalescing
        guard let pause else { return context.read() }
        guard pausedRead == nil else { return }
        pausedRead = context.eventLoop.assumeIsolated().scheduleTask(in: .nanoseconds(pause)) { [self] in
            pausedRead = nil
            self.context?.read()
        }
    }

    /// The smallest smoothed RTT of this socket's connections in nanoseconds; nil while any of
    /// them has no RTT sample yet (a handshake under way), when there is none, or when there are
    /// so many that asking each after every small read would cost more than a pause saves.
    private func smallestRoundTrip() -> Int64? {
        guard drivers.count <= Self.mostConnectionsToPauseFor else { return nil }
        var smallest: Int64?
        for driver in drivers.values {
            guard let roundTrip = driver.engine.measuredRoundTrip else { return nil }
            smallest = min(smallest ?? roundTrip, roundTrip)
        }
        return smallest
    }

    private func processReceived() {
        let batch = dirty
        dirty.removeAll(keepingCapacity: true)
        lastDirty = nil
        for driver in batch.values { driver.process() }
        flushIfNeeded()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            for driver in Array(drivers.values) { driver.socketWritable() }
            flushIfNeeded()
        }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if server == nil, let driver = clientDriver, driver.engine.isHandshakeComplete, !driver.engine.isTerminated {
            // The socket died under a live connection: Linux fails sendmsg with ENETUNREACH
            // while the interface is down, and NIO closes a datagram socket on that error. For
            // QUIC that is packet loss, not the end: the connection goes on from a new socket.
            detach(client: driver)
            driver.socketDied()
        } else {
            for driver in Array(drivers.values) { driver.socketClosed() }  // each forgets itself: its window goes back
        }
        pausedRead?.cancel()
        pausedRead = nil
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ICMP errors and the like on an unconnected UDP socket concern one packet, not the
        // socket: the connections' own timers decide when a peer is gone.
    }

    private func handle(_ datagram: UnsafeRawBufferPointer, path: QUICPath, now: QUICTime) {
        if let clientDriver {
            clientDriver.receive(datagram, path: path, now: now)
            markDirty(clientDriver)
            return
        }
        // Only the length here: a copy of `server` (closures, arrays) per datagram cost
        // reference counting on every packet of a transfer.
        guard let connectionIDLength = server?.connectionIDLength else { return }
        switch QUICPacketHeader.decode(datagram: datagram, shortHeaderConnectionIDLength: connectionIDLength) {
        case .supported(let header):
            if let driver = routes[header.destinationConnectionID] {
                driver.receive(datagram, path: path, now: now)
                markDirty(driver)
                return
            }
            guard let server else { return }
            if header.isLongHeader {
                handleUnrouted(longHeader: datagram, path: path, server: server)
            } else if header.destinationConnectionID.starts(with: server.connectionIDPrefix),
                      spend(from: path.remote) {
                sendStatelessReset(for: header.destinationConnectionID, triggeredBy: datagram.count, to: path.remote, server: server)
            }
        case .unsupportedVersion(let header):
            if datagram.count >= 1200, versionNegotiationBudget.hasRoom(now: now), spend(from: path.remote),
               versionNegotiationBudget.spend(now: now), let reply = QUICVersionNegotiation.write(for: header) {
                sendRaw(reply, to: path.remote)
            }
        case .invalid:
            break
        }
    }

    /// A long-header datagram no connection claims: a client's first Initial, perhaps after a
    /// Retry. Everything before the source's budget is header parsing, no cryptography.
    private func handleUnrouted(longHeader datagram: UnsafeRawBufferPointer, path: QUICPath, server: Server) {
        guard datagram.count >= 1200, drivers.count < server.maximumConnections,
              let initial = QUICInitialPacket.accept(datagram: datagram), spend(from: path.remote)
        else { return }
        let now = QUICClock.now
        if let original = QUICRetry.validate(initial, remote: path.remote, secret: retrySecret, now: now) {
            accept(initial, datagram: datagram, path: path, server: server, retriedFrom: original)
        } else if underLoad(server, now: now) {
            // A token that fails validation is answered like none: with a fresh Retry (a
            // client's own NEW_TOKEN tokens are never issued here).
            sendRetry(for: initial, to: path.remote, triggeredBy: datagram.count, server: server, now: now)
        } else {
            accept(initial, datagram: datagram, path: path, server: server, retriedFrom: nil)
        }
    }

    /// Whether the datagram's source may still cost the listener an answer or a set-up.
    private func spend(from remote: QUICSocketAddress) -> Bool {
        sourceBudgets.spend(remote, now: QUICClock.now)
    }

    private func accept(
        _ initial: QUICInitialPacket, datagram: UnsafeRawBufferPointer, path: QUICPath, server: Server, retriedFrom original: QUICConnectionID?
    ) {
        guard let context else { return }
        var (configuration, verifier) = server.makeConfiguration(path.remote.isLoopback)
        let window = server.receiveWindows.limit(&configuration)
        let engine: QUICConnection
        do {
            engine = try QUICConnection(
                serverWith: configuration, initialPacket: initial, path: path, now: QUICClock.now, retriedFrom: original)
        } catch {
            server.receiveWindows.giveBack(window)
            return
        }
        let driver = server.makeConnection(engine, verifier, context.eventLoop)
        windowGrants[ObjectIdentifier(driver)] = window
        wire(driver)
        routes[initial.destinationConnectionID] = driver  // retransmitted Initials still carry it
        pendingHandshakes += 1
        acceptedThisSecond += 1
        driver.handshakeResult.assumeIsolated().whenComplete { [weak self] _ in self?.pendingHandshakes -= 1 }
        driver.receive(datagram, path: path, now: QUICClock.now)
        markDirty(driver)
    }

    /// Has ``processReceived()`` run the connection after this batch.
    private func markDirty(_ driver: any QUICEndpointConnection) {
        let key = ObjectIdentifier(driver)
        guard key != lastDirty else { return }
        lastDirty = key
        dirty[key] = driver
    }

    private func underLoad(_ server: Server, now: QUICTime) -> Bool {
        let second = now.nanoseconds / 1_000_000_000
        if second != acceptSecond {
            acceptSecond = second
            acceptedThisSecond = 0
        }
        return pendingHandshakes >= server.retryAbovePendingHandshakes
            || acceptedThisSecond >= 2 * server.retryAbovePendingHandshakes
    }

    /// Asks a client to prove its address: a Retry with a sealed token, no state kept. A Retry
    /// is a fraction of the Initial that triggered it (at least 1200 bytes): it amplifies nothing.
    private func sendRetry(for initial: QUICInitialPacket, to remote: QUICSocketAddress, triggeredBy length: Int, server: Server, now: QUICTime) {
        guard retryBudget.spend(now: now) else { return }
        let retryID = QUICConnectionID((0..<server.connectionIDLength).map { _ in UInt8.random(in: 0...255) })!
        guard let packet = QUICRetry.write(for: initial, remote: remote, secret: retrySecret, retryConnectionID: retryID, now: now),
              packet.count < length
        else { return }
        retriesSent += 1
        sendRaw(packet, to: remote)
    }

    /// Tells a peer that this endpoint no longer knows its connection (it restarted, or the
    /// connection ended long ago), so the peer fails at once instead of at its idle timeout.
    private func sendStatelessReset(for id: QUICConnectionID, triggeredBy length: Int, to remote: QUICSocketAddress, server: Server) {
        guard resetBudget.spend(now: QUICClock.now) else { return }
        let token = QUICStatelessReset.token(secret: server.statelessResetSecret, connectionID: id)
        guard let reset = QUICStatelessReset.write(token: token, triggeringPacketLength: length) else { return }
        sendRaw(reset, to: remote)
    }

    // MARK: Send

    /// The engine writes its packets straight into the buffer the socket sends. Most calls end
    /// with nothing due; their buffer is kept for the next call instead of allocated afresh.
    func sendNextBatch(of engine: QUICConnection) -> Bool {
        guard let context, context.channel.isActive else { return false }
        let capacity = engine.transmitCapacity
        var buffer = unusedSendBuffer.take() ?? context.channel.allocator.buffer(capacity: capacity)
        var written: QUICTransmitInfo?
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: capacity) { raw in
            written = engine.pollTransmit(now: QUICClock.now, into: raw)
            return written?.byteCount ?? 0
        }
        guard let transmit = written else {
            unusedSendBuffer = buffer
            return false
        }
        guard let address = socketAddress(of: transmit.path.remote) else { return true }  // unroutable: drop
        let metadata = transmit.segmentCount > 1
            ? AddressedEnvelope<ByteBuffer>.Metadata(ecnState: .transportNotCapable, packetInfo: nil, segmentSize: transmit.segmentSize)
            : nil
        context.write(wrapOutboundOut(AddressedEnvelope(remoteAddress: address, data: buffer, metadata: metadata)), promise: nil)
        needsFlush = true
        return context.channel.isWritable
    }

    private func socketAddress(of remote: QUICSocketAddress) -> SocketAddress? {
        if let (quic, nio) = lastDestination, quic == remote { return nio }
        guard let address = remote.socketAddress else { return nil }
        lastDestination = (remote, address)
        return address
    }

    private func sendRaw(_ bytes: [UInt8], to remote: QUICSocketAddress) {
        guard let context, let address = remote.socketAddress else { return }
        context.write(wrapOutboundOut(AddressedEnvelope(remoteAddress: address, data: ByteBuffer(bytes: bytes))), promise: nil)
        needsFlush = true
    }

    /// Pushes what ``sendNextBatch(of:)`` queued onto the wire.
    func flushIfNeeded() {
        guard needsFlush, let context else { return }
        needsFlush = false
        context.flush()
    }

    /// Closes every connection (each sends CONNECTION_CLOSE), then the socket.
    func shutdown() {
        for driver in Array(drivers.values) { driver.close(code: 0, reason: "") }
        flushIfNeeded()
        context?.close(promise: nil)
    }
}

extension QUICSocketAddress {
    /// From a NIO socket address (IPv4 or IPv6).
    init?(_ address: SocketAddress) {
        let converted = address.withSockAddr { pointer, size in
            QUICSocketAddress(sockaddrBytes: UnsafeRawBufferPointer(start: pointer, count: size))
        }
        guard let converted else { return nil }
        self = converted
    }

    /// As a NIO socket address.
    var socketAddress: SocketAddress? {
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        let family = isIPv6 ? AF_INET6 : AF_INET
        let ok = addressBytes.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &text, socklen_t(text.count)) } != nil
        guard ok else { return nil }
        let digits = text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        return try? SocketAddress(ipAddress: String(decoding: digits, as: UTF8.self), port: Int(port))
    }
}
