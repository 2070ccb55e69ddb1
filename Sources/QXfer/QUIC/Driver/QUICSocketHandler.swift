import NIOCore
import QUICEngine

#if canImport(Glibc)
import Glibc
#endif

/// One UDP socket carrying QUIC: splits GRO batches into datagrams, routes them to
/// connections by destination connection ID, accepts new connections (server), answers
/// unknown versions, and sends GSO batches.
final class QUICSocketHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    typealias OutboundOut = AddressedEnvelope<ByteBuffer>

    /// What a listening socket needs to accept connections.
    struct Server {
        /// A configuration (with a fresh verifier) for each new connection.
        var makeConfiguration: () -> (QUICConfiguration, PeerVerifier)
        var acceptedProtocols: [String]
        /// Called on the event loop when a connection completes its handshake.
        var accepted: (QUICConnectionDriver) -> Void
        /// Connections beyond this many are ignored until others end.
        var maximumConnections = 4096
        /// The secret stateless-reset tokens derive from (the engines use the same one).
        var statelessResetSecret: [UInt8]
        /// The length of the connection IDs the engines issue: short headers do not carry it.
        var connectionIDLength: Int
    }

    /// Stateless resets this socket may still send in the current second: answers to
    /// unknown connections must not become an amplifier.
    private var resetBudget = 0
    private var resetBudgetSecond: UInt64 = 0
    static let resetsPerSecond = 100

    private let server: Server?
    private var context: ChannelHandlerContext?
    private(set) var localAddress: QUICSocketAddress?
    private var routes: [QUICConnectionID: QUICConnectionDriver] = [:]
    private var drivers: [ObjectIdentifier: QUICConnectionDriver] = [:]
    private var dirty: [ObjectIdentifier: QUICConnectionDriver] = [:]
    private var needsFlush = false
    /// The connection of a client socket, which has exactly one.
    private var clientDriver: QUICConnectionDriver?

    /// A listening socket with `server`, or a client's socket with nil.
    init(server: Server?) {
        self.server = server
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        updateLocalAddress()
    }

    func channelActive(context: ChannelHandlerContext) {
        updateLocalAddress()
        context.fireChannelActive()
    }

    private func updateLocalAddress() {
        localAddress = context?.channel.localAddress.flatMap(QUICSocketAddress.init)
    }

    /// Attaches a client connection to this socket.
    func attach(client driver: QUICConnectionDriver) {
        clientDriver = driver
        wire(driver)
    }

    /// Lets go of a client connection that moves to another socket, so closing this one does
    /// not end it.
    func detach(client driver: QUICConnectionDriver) {
        guard clientDriver === driver else { return }
        clientDriver = nil
        drivers[ObjectIdentifier(driver)] = nil
        dirty[ObjectIdentifier(driver)] = nil
        routes.removeAll()
    }

    private func wire(_ driver: QUICConnectionDriver) {
        let key = ObjectIdentifier(driver)
        drivers[key] = driver
        driver.send = { [unowned self] transmit in self.send(transmit) }
        driver.flush = { [unowned self] in self.flushIfNeeded() }
        driver.route = { [unowned self, unowned driver] id, add in
            if add { self.routes[id] = driver } else if self.routes[id] === driver { self.routes[id] = nil }
        }
        driver.socket = context?.channel
        driver.onTerminated = { [unowned self, unowned driver] in
            self.drivers[ObjectIdentifier(driver)] = nil
            self.dirty[ObjectIdentifier(driver)] = nil
            self.routes = self.routes.filter { $0.value !== driver }
            if self.server == nil { self.context?.close(promise: nil) }
        }
        for id in driver.engine.sourceConnectionIDs { routes[id] = driver }
    }

    // MARK: Receive

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        guard let remote = QUICSocketAddress(envelope.remoteAddress), let local = localAddress else { return }
        let path = QUICPath(local: local, remote: remote)
        let total = envelope.data.readableBytes
        let segment = max(envelope.metadata?.segmentSize ?? total, 1)
        envelope.data.withUnsafeReadableBytes { all in
            var offset = 0
            while offset < all.count {
                let length = min(segment, all.count - offset)
                handle(UnsafeRawBufferPointer(rebasing: all[offset..<(offset + length)]), path: path)
                offset += length
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        let batch = dirty
        dirty.removeAll(keepingCapacity: true)
        for driver in batch.values { driver.process() }
        flushIfNeeded()
        context.fireChannelReadComplete()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            for driver in Array(drivers.values) { driver.socketWritable() }
            flushIfNeeded()
        }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        for driver in Array(drivers.values) { driver.socketClosed() }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ICMP errors and the like on an unconnected UDP socket concern one packet, not the
        // socket: the connections' own timers decide when a peer is gone.
    }

    private func handle(_ datagram: UnsafeRawBufferPointer, path: QUICPath) {
        if let clientDriver {
            clientDriver.receive(datagram, path: path)
            dirty[ObjectIdentifier(clientDriver)] = clientDriver
            return
        }
        guard let server else { return }
        let bytes = Array(datagram)
        switch QUICPacketHeader.decode(datagram: bytes, shortHeaderConnectionIDLength: server.connectionIDLength) {
        case .supported(let header):
            if let driver = routes[header.destinationConnectionID] {
                driver.receive(datagram, path: path)
                dirty[ObjectIdentifier(driver)] = driver
            } else if header.isLongHeader {
                if drivers.count < server.maximumConnections, let initial = QUICInitialPacket.accept(datagram: bytes) {
                    accept(initial, datagram: datagram, path: path, server: server)
                }
            } else {
                sendStatelessReset(for: header.destinationConnectionID, triggeredBy: bytes.count, to: path.remote, server: server)
            }
        case .unsupportedVersion(let header):
            if bytes.count >= 1200, let reply = QUICVersionNegotiation.write(for: header) {
                sendRaw(reply, to: path.remote)
            }
        case .invalid:
            break
        }
    }

    private func accept(_ initial: QUICInitialPacket, datagram: UnsafeRawBufferPointer, path: QUICPath, server: Server) {
        guard let context else { return }
        let (configuration, verifier) = server.makeConfiguration()
        let engine: QUICConnection
        do {
            engine = try QUICConnection(serverWith: configuration, initialPacket: initial, path: path, now: QUICConnectionDriver.now)
        } catch {
            return
        }
        let driver = QUICConnectionDriver(
            engine: engine, eventLoop: context.eventLoop, verifier: verifier, acceptedProtocols: server.acceptedProtocols)
        wire(driver)
        routes[initial.destinationConnectionID] = driver  // retransmitted Initials still carry it
        let accepted = server.accepted
        driver.handshake.futureResult.whenSuccess { [unowned driver] _ in accepted(driver) }
        driver.receive(datagram, path: path)
        dirty[ObjectIdentifier(driver)] = driver
    }

    /// Tells a peer that this endpoint no longer knows its connection (it restarted, or the
    /// connection ended long ago), so the peer fails at once instead of at its idle timeout.
    private func sendStatelessReset(for id: QUICConnectionID, triggeredBy length: Int, to remote: QUICSocketAddress, server: Server) {
        let second = QUICConnectionDriver.now.nanoseconds / 1_000_000_000
        if second != resetBudgetSecond {
            resetBudgetSecond = second
            resetBudget = Self.resetsPerSecond
        }
        guard resetBudget > 0 else { return }
        let token = QUICStatelessReset.token(secret: server.statelessResetSecret, connectionID: id)
        guard let reset = QUICStatelessReset.write(token: token, triggeringPacketLength: length) else { return }
        resetBudget -= 1
        sendRaw(reset, to: remote)
    }

    // MARK: Send

    private func send(_ transmit: QUICTransmit) -> Bool {
        guard let context, context.channel.isActive else { return false }
        guard let address = transmit.path.remote.socketAddress else { return true }  // unroutable: drop
        var buffer = context.channel.allocator.buffer(capacity: transmit.data.count)
        buffer.writeBytes(transmit.data)
        let metadata = transmit.segmentCount > 1
            ? AddressedEnvelope<ByteBuffer>.Metadata(ecnState: .transportNotCapable, packetInfo: nil, segmentSize: transmit.segmentSize)
            : nil
        context.write(wrapOutboundOut(AddressedEnvelope(remoteAddress: address, data: buffer, metadata: metadata)), promise: nil)
        needsFlush = true
        return context.channel.isWritable
    }

    private func sendRaw(_ bytes: [UInt8], to remote: QUICSocketAddress) {
        guard let context, let address = remote.socketAddress else { return }
        context.write(wrapOutboundOut(AddressedEnvelope(remoteAddress: address, data: ByteBuffer(bytes: bytes))), promise: nil)
        needsFlush = true
    }

    private func flushIfNeeded() {
        guard needsFlush, let context else { return }
        needsFlush = false
        context.flush()
    }

    /// Closes every connection (each sends CONNECTION_CLOSE), then the socket.
    func shutdown() {
        for driver in Array(drivers.values) { driver.close() }
        flushIfNeeded()
        context?.close(promise: nil)
    }
}

extension QUICSocketAddress {
    /// From a NIO socket address (IPv4 or IPv6).
    init?(_ address: SocketAddress) {
        let converted: QUICSocketAddress?? = try? address.withSockAddr { pointer, size in
            QUICSocketAddress(sockaddrBytes: UnsafeRawBufferPointer(start: pointer, count: size))
        }
        guard let converted, let converted else { return nil }
        self = converted
    }

    /// As a NIO socket address.
    var socketAddress: SocketAddress? {
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        let family = isIPv6 ? AF_INET6 : AF_INET
        let ok = addressBytes.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &text, socklen_t(text.count)) } != nil
        guard ok else { return nil }
        return try? SocketAddress(ipAddress: String(cString: text), port: Int(port))
    }
}
