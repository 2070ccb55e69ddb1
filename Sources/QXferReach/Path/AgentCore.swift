import Crypto
import FoundationEssentials
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// The path agent's state and sockets, all on one event loop (no lock on the data path): the
/// relay's control connection, the one wide UDP socket toward the relay and the peer, the local
/// sockets the stacks use, the ``PathEngine`` that decides, and the flow tables. Handlers call in
/// here; every method runs on ``eventLoop``.
final class AgentCore {
    let eventLoop: any EventLoop
    let side: RoomSide
    let relay: RelayClient
    /// The relay's UDP port (the control connection's address).
    let relayUDP: SocketAddress
    let options: PathOptions
    private let stats: AgentStats
    private let bindToken: [UInt8]
    private var engine: PathEngine<SocketAddress>
    private let clockOrigin = NIODeadline.now()
    /// "Now" as of the last tick or event: flows' idle times need no finer clock, and the data
    /// path reads no clock per datagram.
    private var coarseNow: Duration = .zero

    // Sockets.
    private var wide: (any Channel)?
    private var widePort = 0
    private var fronts: [OfferFront?] = [nil, nil]
    private var frontWaiters: [[EventLoopPromise<UInt16>]] = [[], []]
    private var servedPorts: [UInt16?] = [nil, nil]
    /// Splices the peer opened for a service not served yet.
    private var waitingSplices: [(id: Int, service: PeerService)] = []
    private var flows: FlowTable<FlowSocket>
    private var tcpChannels: [ObjectIdentifier: any Channel] = [:]
    private var nextSpliceID = 0
    private var tickTask: Scheduled<Void>?
    private var tickCount = 0
    private var closing = false

    // Meeting the peer.
    private var paired = false
    private var meeting = false
    private var met = false
    private var ended: ReachError?
    private var ownSignal: [UInt8]?
    private var peerSignal: (bytes: [UInt8], token: [UInt8], candidates: [SocketAddress])?
    private var meetPromise: EventLoopPromise<Void>?
    private var meetTimer: Scheduled<Void>?
    private var meetingError: ReachError?

    // The data path.
    private var destination: SocketAddress
    private var destinationIsDirect = false
    /// Datagrams for the peer, gathered until the end of a read.
    private var toPeer = DatagramBatches<PeerTarget>()
    /// Datagrams for this host's sockets, gathered until the end of a read of the wide socket.
    private var toLocal = DatagramBatches<LocalTarget>()
    private var wideWritten = false
    private var localToFlush: [any LocalSocket] = []

    /// Datagrams kept for a flow whose socket is still opening.
    static let pendingPerOpeningFlow = 8
    /// At most this many splices at once (the relay's own limit per room).
    static let maximumSplices = 16
    /// Between two ticks of the engine's clock.
    static let tickInterval: TimeAmount = .milliseconds(250)

    init(client: RelayClient, side: RoomSide, options: PathOptions, stats: AgentStats) throws(ReachError) {
        guard let welcome = client.welcome, let relayUDP = client.relaySocketAddress else {
            throw ReachError(.protocolViolation, "the relay's welcome is missing")
        }
        self.eventLoop = client.eventLoop
        self.side = side
        self.relay = client
        self.relayUDP = relayUDP
        self.options = options
        self.stats = stats
        self.bindToken = welcome.bindToken
        self.destination = relayUDP
        var token = [UInt8](repeating: 0, count: RelayMessage.tokenSize)
        var random = SystemRandomNumberGenerator()
        for index in token.indices { token[index] = random.next() }
        self.engine = PathEngine(token: token, bindToken: welcome.bindToken, punching: options.punching, timing: options.timing)
        self.flows = FlowTable(capacity: options.flowCapacity, idleTimeout: options.flowIdleTimeout)
    }

    // MARK: - Life

    /// Opens the wide UDP socket, starts binding the relay and the clock; listens to the relay.
    func start() -> EventLoopFuture<Void> {
        relay.onEvent = { [weak self] event in self?.relayEvent(event) }
        return openWide(port: 0).assumeIsolated().map { _ in
            self.coarseNow = self.now()
            self.perform(self.engine.start(now: self.coarseNow))
            self.scheduleTick()
        }.nonisolated()
    }

    /// Closes everything; completes when every socket is closed.
    func close() -> EventLoopFuture<Void> {
        closing = true
        tickTask?.cancel()
        tickTask = nil
        failMeeting(ReachError(.local, "the path was closed"))
        relay.close()
        var channels: [any Channel] = []
        if let wide { channels.append(wide) }
        wide = nil
        for front in fronts.compactMap({ $0 }) {
            channels += [front.udp, front.tcp].compactMap { $0 }
            front.udp = nil
            front.tcp = nil
        }
        for waiters in frontWaiters { for waiter in waiters { waiter.fail(ReachError(.local, "the path was closed")) } }
        frontWaiters = [[], []]
        for socket in flows.removeAll() {
            socket.closed = true
            if let channel = socket.channel { channels.append(channel) }
        }
        channels += tcpChannels.values
        tcpChannels = [:]
        let closed = channels.map { channel in
            let promise = eventLoop.makePromise(of: Void.self)
            channel.close(promise: promise)
            return promise.futureResult
        }
        return EventLoopFuture.andAllComplete(closed, on: eventLoop)
    }

    private func now() -> Duration {
        .nanoseconds(Int64(clamping: NIODeadline.now().uptimeNanoseconds &- clockOrigin.uptimeNanoseconds))
    }

    private func scheduleTick() {
        guard !closing else { return }
        tickTask = eventLoop.assumeIsolated().scheduleTask(in: Self.tickInterval) { [weak self] in
            guard let self else { return }
            self.tick()
        }
    }

    private func tick() {
        guard !closing else { return }
        coarseNow = now()
        tickCount += 1
        if wide == nil, widePort != 0 || tickCount > 1 { reopenWide() }
        for (index, front) in fronts.enumerated() where front != nil && front!.udp == nil && !front!.reopening {
            reopenFront(index)
        }
        perform(engine.tick(now: coarseNow))
        syncRoute()
        advanceMeeting()
        if tickCount % 4 == 0 { expireFlows() }
        scheduleTick()
    }

    // MARK: - The relay's control connection

    private func relayEvent(_ event: RelayEvent) {
        switch event {
        case .paired:
            paired = true
            advanceMeeting()
        case .signal(let bytes):
            received(signal: bytes)
        case .peerGone:
            if !met { failMeeting(ReachError(.peerGone, "the other side left before the transfer began"), forGood: true) }
        case .ended(let error):
            ended = error
            if !met { failMeeting(error) }
        }
    }

    private func received(signal bytes: [UInt8]) {
        let signal: PeerSignal
        do { signal = try PeerSignal(decoding: Data(bytes)) } catch {
            if !met { failMeeting(ReachError(.protocolViolation, "the peer sent a malformed signal"), forGood: true) }
            return
        }
        switch signal {
        case .candidates(let udp, let token):
            guard peerSignal == nil else { return }
            let addresses = udp.compactMap { Self.candidate(parsing: $0, family: relayUDP.protocol) }
            peerSignal = (bytes, Array(token), addresses)
            advanceMeeting()
        case .splice(let id, let service):
            guard side == .answer, peerSignal != nil, let service = PeerService(rawValue: service) else { return }
            openAnswerSplice(id: id, service: service)
        }
    }

    // MARK: - Meeting the peer

    func meet(timeout: Duration) -> EventLoopFuture<Void> {
        if met { return eventLoop.makeSucceededVoidFuture() }
        if let error = meetingError ?? ended { return eventLoop.makeFailedFuture(error) }
        if let meetPromise { return meetPromise.futureResult }
        let promise = eventLoop.makePromise(of: Void.self)
        meetPromise = promise
        meeting = true
        meetTimer = eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(timeout)) { [weak self] in
            guard let self else { return }
            let seconds = timeout.components.seconds
            self.failMeeting(self.paired
                ? ReachError(.timedOut, "the other side did not answer within \(seconds) s")
                : ReachError(.timedOut, "no one came with the code within \(seconds) s"))
        }
        advanceMeeting()
        return promise.futureResult
    }

    private func advanceMeeting() {
        guard meeting, !met, ended == nil, paired, engine.bindingSettled else { return }
        if ownSignal == nil {
            let signal = PeerSignal.candidates(udp: ownCandidates(), token: Data(engine.token))
            guard let bytes = try? Array(signal.encoded()), relay.send(signal: bytes) else {
                return failMeeting(ReachError(.relayUnreachable, "cannot send the candidates to the relay"))
            }
            ownSignal = bytes
        }
        guard let ownSignal, let peerSignal else { return }
        met = true
        let (offer, answer) = side == .offer ? (ownSignal, peerSignal.bytes) : (peerSignal.bytes, ownSignal)
        stats.set(transcript: Self.transcript(offer: offer, answer: answer))
        coarseNow = now()
        perform(engine.peerKnown(token: peerSignal.token, candidates: peerSignal.candidates, now: coarseNow))
        meetTimer?.cancel()
        meetPromise?.succeed()
        meetPromise = nil
    }

    /// Fails a waiting ``meet(timeout:)``; `forGood`: later ones too (the peer left or broke
    /// the protocol before the meeting, perhaps before anyone waited for it).
    private func failMeeting(_ error: ReachError, forGood: Bool = false) {
        if forGood, !met, meetingError == nil { meetingError = error }
        meetTimer?.cancel()
        meetPromise?.fail(error)
        meetPromise = nil
        if !met { meeting = false }
    }

    /// C of docs/PROTOCOL.md §9.6.
    static func transcript(offer: [UInt8], answer: [UInt8]) -> [UInt8] {
        var hash = SHA256()
        for part in [offer, answer] {
            withUnsafeBytes(of: UInt64(part.count).littleEndian) { hash.update(bufferPointer: $0) }
            hash.update(data: part)
        }
        return Array(hash.finalize())
    }

    /// This side's candidates: each interface address of the wide socket's family with its port
    /// (loopback only when the relay is on loopback: then both peers are on this host), then the
    /// address the relay saw. None when UDP to the relay is blocked.
    private func ownCandidates() -> [String] {
        guard case .bound(let reflexive) = engine.binding else { return [] }
        var list: [String] = []
        if Self.isLoopback(relayUDP) {
            list.append(relayUDP.protocol == .inet6 ? "[::1]:\(widePort)" : "127.0.0.1:\(widePort)")
        } else {
            for device in (try? System.enumerateDevices()) ?? [] {
                guard let address = device.address, address.protocol == relayUDP.protocol, Self.isUsable(address),
                      !Self.isLoopback(address), !Self.isLinkLocal(address), let ip = address.ipAddress,
                      let withPort = try? SocketAddress(ipAddress: ip, port: widePort), let text = Self.text(withPort),
                      !list.contains(text) else { continue }
                list.append(text)
            }
        }
        list = Array(list.prefix(PeerSignal.maximumCandidates - 1))
        let bound = reflexive.description
        if !list.contains(bound) { list.append(bound) }
        return list
    }

    // MARK: - Addresses

    static func text(_ address: SocketAddress) -> String? {
        guard let ip = address.ipAddress, let port = address.port else { return nil }
        return address.protocol == .inet6 ? "[\(ip)]:\(port)" : "\(ip):\(port)"
    }

    /// A peer's candidate "A:P" or "[A]:P": a unicast address of `family`, or nil.
    static func candidate(parsing text: String, family: NIOBSDSocket.ProtocolFamily?) -> SocketAddress? {
        guard let parsed = RelayAddress(parsing: text, defaultPort: 0),
              let address = try? SocketAddress(ipAddress: parsed.host, port: Int(parsed.port)),
              address.protocol == family, isUsable(address) else { return nil }
        return address
    }

    /// Unicast: not unspecified, multicast or broadcast (a send there fails, and NIO closes a
    /// socket whose send fails so).
    static func isUsable(_ address: SocketAddress) -> Bool {
        switch address {
        case .v4(let v4):
            let ip = UInt32(bigEndian: v4.address.sin_addr.s_addr)
            return ip >> 24 != 0 && ip < 0xE000_0000 && address.port != 0
        case .v6(let v6):
            let bytes = withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) }
            return bytes[0] != 0xFF && bytes.contains { $0 != 0 } && address.port != 0
        default:
            return false
        }
    }

    static func isLoopback(_ address: SocketAddress) -> Bool {
        switch address {
        case .v4(let v4): return UInt32(bigEndian: v4.address.sin_addr.s_addr) >> 24 == 127
        case .v6(let v6): return withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) } == Array(repeating: 0, count: 15) + [1]
        default: return false
        }
    }

    static func isLinkLocal(_ address: SocketAddress) -> Bool {
        guard case .v6(let v6) = address else { return false }
        return withUnsafeBytes(of: v6.address.sin6_addr) { $0[0] == 0xFE && $0[1] & 0xC0 == 0x80 }
    }

    // MARK: - The engine's decisions

    private func perform(_ actions: [PathEngine<SocketAddress>.Action]) {
        guard !actions.isEmpty, let wide else { return }
        for action in actions {
            switch action {
            case .toRelay(let bytes):
                wide.write(AddressedEnvelope(remoteAddress: relayUDP, data: ByteBuffer(bytes: bytes)), promise: nil)
            case .send(let bytes, let address):
                let promise = eventLoop.makePromise(of: Void.self)
                wide.write(AddressedEnvelope(remoteAddress: address, data: ByteBuffer(bytes: bytes)), promise: promise)
                promise.futureResult.assumeIsolated().whenFailure { [weak self] error in
                    guard let self else { return }
                    // A send the kernel refused (no route, a firewall) closes NIO's socket: that
                    // candidate is not tried again.
                    if error is IOError { self.engine.forget(address) }
                }
            }
        }
        wide.flush()
    }

    private func syncRoute() {
        switch engine.route {
        case .relayed:
            guard destinationIsDirect else { return }
            destination = relayUDP
            destinationIsDirect = false
            stats.set(route: .relayed)
        case .direct(let address):
            guard !destinationIsDirect || destination != address else { return }
            destination = address
            destinationIsDirect = true
            stats.set(route: .direct(peer: Self.text(address) ?? "\(address)"))
        }
    }

    func stopPunching() {
        engine.stopPunching()
    }

    /// Tests: the wide socket's port.
    var widePortNumber: Int { widePort }

    func allowPunching() {
        coarseNow = now()
        perform(engine.allowPunching(now: coarseNow))
    }

    // MARK: - The wide socket

    private func openWide(port: Int) -> EventLoopFuture<Void> {
        let host = relayUDP.protocol == .inet6 ? "::" : "0.0.0.0"
        // No SO_REUSEADDR: another local socket must not share the port the peer punched.
        return DatagramBootstrap(group: eventLoop)
            .bind(host: host, port: port)
            .assumeIsolated().flatMapThrowing { channel in
                try Self.tune(channel, pathMTU: true)
                try channel.pipeline.syncOperations.addHandler(WideSocketHandler(core: self))
                if self.closing {
                    channel.close(promise: nil)
                    throw ReachError(.local, "the path was closed")
                }
                self.wide = channel
                self.widePort = channel.localAddress?.port ?? 0
            }.nonisolated()
            .flatMapErrorThrowing { error in
                if let error = error as? ReachError { throw error }
                throw ReachError(.local, "cannot open a UDP socket: \(RelayClient.describe(error))")
            }
    }

    private var reopeningWide = false

    /// The wide socket closed under the agent (NIO closes a socket whose send the kernel refused):
    /// the same port again, so the NAT mapping the peer punched stays; another port if taken.
    private func reopenWide() {
        guard !reopeningWide, !closing else { return }
        reopeningWide = true
        let port = widePort
        openWide(port: port).assumeIsolated().whenComplete { [weak self] result in
            guard let self else { return }
            self.reopeningWide = false
            guard case .success = result else {
                if port != 0 { self.widePort = 0 }
                return
            }
            // The relay learns the (perhaps new) address at once.
            self.perform([.toRelay(RelayDatagram.bind(token: self.bindToken).encoded)])
        }
    }

    func wideClosed(_ channel: any Channel) {
        guard wide === channel else { return }
        wide = nil
        toPeer.drain { _, _, _ in }
        // Datagrams the direct path refused may be why: the relay carries them meanwhile.
        if destinationIsDirect {
            coarseNow = now()
            perform(engine.directPathFailed(now: coarseNow))
            syncRoute()
        }
    }

    /// What the wide socket read: one datagram, or several the kernel coalesced (GRO).
    func wideRead(_ envelope: AddressedEnvelope<ByteBuffer>) {
        let source = envelope.remoteAddress
        // The relay's address is compared once per read, not per datagram.
        let viaRelay = source == relayUDP
        let trusted = viaRelay || engine.isTrusted(source)
        DatagramBatches<LocalTarget>.forEachDatagram(in: envelope.data, segmentSize: envelope.metadata?.segmentSize) { datagram in
            wideDatagram(datagram, from: source, viaRelay: viaRelay, trusted: trusted)
        }
    }

    /// A datagram on the wide socket: the peer's data (from the relay or a trusted address),
    /// the relay's `bound`, a punch or its answer.
    private func wideDatagram(_ datagram: ByteBuffer, from source: SocketAddress, viaRelay: Bool, trusted: Bool) {
        var data = datagram
        guard let type = data.getInteger(at: data.readerIndex, as: UInt8.self) else { return }
        if type == RelayDatagram.dataType {
            guard met, trusted,
                  let service = data.getInteger(at: data.readerIndex + 1, as: UInt8.self),
                  let flow = data.getInteger(at: data.readerIndex + 2, as: UInt16.self) else { return }
            data.moveReaderIndex(forwardBy: PeerDatagram.dataHeaderSize)
            guard data.readableBytes > 0 else { return }
            stats.count(UInt64(data.readableBytes), direct: !viaRelay)
            if side == .offer {
                deliverToFront(service: service, flow: flow, data)
            } else {
                deliverToFlow(FlowKey(service: service, flow: flow), data)
            }
            return
        }
        guard data.readableBytes <= 64 else { return }
        let bytes = Array(data.readableBytesView)[...]
        if type == RelayDatagram.boundType {
            guard viaRelay, case .bound(let address) = RelayDatagram(decoding: bytes) else { return }
            engine.relayBound(address, now: coarseNow)
            advanceMeeting()
            return
        }
        guard let datagram = PeerDatagram(decoding: bytes) else { return }
        let now = self.now()
        switch datagram {
        case .punch(let token, let nonce):
            perform(engine.receivedPunch(token: token, nonce: nonce, from: source, now: now))
        case .punched(let token, let nonce):
            perform(engine.receivedPunched(token: token, nonce: nonce, from: source, now: now))
            syncRoute()
        case .data:
            break
        }
    }

    // MARK: - Toward the peer

    /// Copies one of this host's datagrams, with its header, into the batch for the peer.
    private func sendToPeer(service: UInt8, flow: UInt16, _ payload: ByteBuffer) {
        guard met, let wide, wide.isWritable else { return }
        if !toPeer.append(to: PeerTarget(), header: (service, flow), payload: payload, allocator: wide.allocator) {
            // A full buffer goes out now: a long read (up to 64 coalesced batches) is not held
            // back whole until its end.
            flushToPeer()
            guard toPeer.append(to: PeerTarget(), header: (service, flow), payload: payload, allocator: wide.allocator) else { return }
        }
        stats.count(UInt64(payload.readableBytes), direct: destinationIsDirect)
    }

    /// Writes the batches for the peer, to where the route says now.
    private func emitToPeer() {
        guard !toPeer.isEmpty, let wide else { return }
        let destination = self.destination
        toPeer.drain { _, bytes, segmentSize in
            wide.write(AddressedEnvelope(remoteAddress: destination, data: bytes, metadata: Self.metadata(segmentSize)), promise: nil)
        }
        wideWritten = true
    }

    /// At the end of a read: everything batched for the peer goes out in one flush.
    func flushToPeer() {
        emitToPeer()
        if wideWritten {
            wideWritten = false
            wide?.flush()
        }
    }

    static func metadata(_ segmentSize: Int?) -> AddressedEnvelope<ByteBuffer>.Metadata? {
        segmentSize.map { AddressedEnvelope<ByteBuffer>.Metadata(ecnState: .transportNotCapable, packetInfo: nil, segmentSize: $0) }
    }

    /// Copies one of the peer's datagrams into the batch for a local socket.
    private func sendToLocal(_ socket: any LocalSocket, address: SocketAddress?, _ payload: ByteBuffer, allocator: ByteBufferAllocator) {
        let target = LocalTarget(socket: socket, address: address)
        if !toLocal.append(to: target, header: nil, payload: payload, allocator: allocator) {
            flushToLocal()
            _ = toLocal.append(to: target, header: nil, payload: payload, allocator: allocator)
        }
    }

    private func emitToLocal() {
        toLocal.drain { target, bytes, segmentSize in
            target.socket.write(bytes, to: target.address, segmentSize: segmentSize)
            if !target.socket.flushPending {
                target.socket.flushPending = true
                localToFlush.append(target.socket)
            }
        }
    }

    // MARK: - Offer side: the local ports

    func localPort(for service: PeerService) -> EventLoopFuture<UInt16> {
        guard side == .offer else {
            return eventLoop.makeFailedFuture(ReachError(.local, "only the offer side dials the peer's services"))
        }
        if closing { return eventLoop.makeFailedFuture(ReachError(.local, "the path was closed")) }
        let index = service.rawValue
        if let front = fronts[index] { return eventLoop.makeSucceededFuture(front.port) }
        let promise = eventLoop.makePromise(of: UInt16.self)
        frontWaiters[index].append(promise)
        if frontWaiters[index].count == 1 { openFront(service, attemptsLeft: 8) }
        return promise.futureResult
    }

    /// A UDP socket on 127.0.0.1 and a TCP listener on the same port number.
    private func openFront(_ service: PeerService, attemptsLeft: Int) {
        let index = service.rawValue
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        DatagramBootstrap(group: eventLoop).bind(host: "127.0.0.1", port: 0).assumeIsolated().whenComplete { [weak self] result in
            guard let self else { return }
            guard case .success(let udp) = result, let port = udp.localAddress?.port else {
                return self.frontFailed(index, "cannot open a UDP socket on 127.0.0.1")
            }
            ServerBootstrap(group: self.eventLoop, childGroup: self.eventLoop)
                .childChannelOption(.autoRead, value: false)
                .childChannelOption(.allowRemoteHalfClosure, value: true)
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .childChannelInitializer { channel in
                    bound.value.acceptedLocal(channel, service: service)
                    return channel.eventLoop.makeSucceededVoidFuture()
                }
                .bind(host: "127.0.0.1", port: port)
                .assumeIsolated().whenComplete { result in
                    switch result {
                    case .success(let tcp) where !self.closing:
                        do {
                            try Self.tune(udp, pathMTU: false)
                            try udp.pipeline.syncOperations.addHandler(FrontSocketHandler(core: self, service: UInt8(index)))
                        } catch {
                            udp.close(promise: nil)
                            tcp.close(promise: nil)
                            return self.frontFailed(index, "cannot set up the UDP socket on 127.0.0.1")
                        }
                        let front = OfferFront(port: UInt16(port), udp: udp, tcp: tcp)
                        self.fronts[index] = front
                        let waiters = self.frontWaiters[index]
                        self.frontWaiters[index] = []
                        for waiter in waiters { waiter.succeed(front.port) }
                    case .success(let tcp):
                        udp.close(promise: nil)
                        tcp.close(promise: nil)
                        self.frontFailed(index, "the path was closed")
                    case .failure where attemptsLeft > 1 && !self.closing:
                        // The TCP port of that number is taken: another pair.
                        udp.close(promise: nil)
                        self.openFront(service, attemptsLeft: attemptsLeft - 1)
                    case .failure(let error):
                        udp.close(promise: nil)
                        self.frontFailed(index, "cannot listen on 127.0.0.1:\(port): \(RelayClient.describe(error))")
                    }
                }
        }
    }

    private func frontFailed(_ index: Int, _ reason: String) {
        let waiters = frontWaiters[index]
        frontWaiters[index] = []
        for waiter in waiters { waiter.fail(ReachError(.local, reason)) }
    }

    /// The front's UDP socket closed under the agent: the same port again.
    private func reopenFront(_ index: Int) {
        guard let front = fronts[index], !closing else { return }
        front.reopening = true
        DatagramBootstrap(group: eventLoop).bind(host: "127.0.0.1", port: Int(front.port)).assumeIsolated().whenComplete { [weak self] result in
            guard let self else { return }
            front.reopening = false
            guard case .success(let udp) = result else { return }
            guard !self.closing, (try? Self.tune(udp, pathMTU: false)) != nil,
                  (try? udp.pipeline.syncOperations.addHandler(FrontSocketHandler(core: self, service: UInt8(index)))) != nil else {
                udp.close(promise: nil)
                return
            }
            front.udp = udp
        }
    }

    func frontClosed(_ service: UInt8, _ channel: any Channel) {
        guard let front = fronts[Int(service)], front.udp === channel else { return }
        front.udp = nil
    }

    /// This host's QUIC datagrams (one, or a coalesced batch) toward the peer's `service`.
    func frontRead(_ service: UInt8, _ envelope: AddressedEnvelope<ByteBuffer>) {
        // QUIC never sends an empty datagram; the race's refusal watch does (to learn whether
        // anything listens), and the agent answers that itself by being here.
        guard envelope.data.readableBytes > 0, let front = fronts[Int(service)],
              let flow = front.flows.flow(for: envelope.remoteAddress, now: coarseNow) else { return }
        DatagramBatches<PeerTarget>.forEachDatagram(in: envelope.data, segmentSize: envelope.metadata?.segmentSize) { datagram in
            sendToPeer(service: service, flow: flow, datagram)
        }
    }

    /// A datagram of the peer's for one of this host's QUIC sockets.
    private func deliverToFront(service: UInt8, flow: UInt16, _ data: ByteBuffer) {
        guard Int(service) < fronts.count, let front = fronts[Int(service)], let udp = front.udp, udp.isWritable,
              let address = front.flows.address(of: flow, now: coarseNow) else { return }
        sendToLocal(front, address: address, data, allocator: udp.allocator)
    }

    /// A TCP connection to a local port: a splice carries it to the peer's service.
    func acceptedLocal(_ channel: any Channel, service: PeerService) {
        guard met, !closing, relay.isOpen, relay.signalsLeft > 0, tcpChannels.count < 2 * Self.maximumSplices else {
            channel.close(promise: nil)
            return
        }
        let id = nextSpliceID
        nextSpliceID = (nextSpliceID + 1) & 0xFFFF
        guard let signal = try? Array(PeerSignal.splice(id: id, service: service.rawValue).encoded()), relay.send(signal: signal) else {
            channel.close(promise: nil)
            return
        }
        track(channel)
        RelaySplice.open(relay: relayUDP, bindToken: bindToken, id: id, on: eventLoop).assumeIsolated().whenComplete { [weak self] result in
            guard let self else { return }
            self.joined(channel, result)
        }
    }

    private func joined(_ local: any Channel, _ result: Result<any Channel, any Error>) {
        switch result {
        case .success(let splice):
            track(splice)
            let stats = self.stats
            do {
                try SplicePipe.join(local, splice) { stats.spliced.add(UInt64($0), ordering: .relaxed) }
            } catch {
                local.close(promise: nil)
                splice.close(promise: nil)
            }
        case .failure:
            local.close(promise: nil)
        }
    }

    private func track(_ channel: any Channel) {
        guard !closing else {
            channel.close(promise: nil)
            return
        }
        let id = ObjectIdentifier(channel)
        tcpChannels[id] = channel
        channel.closeFuture.assumeIsolated().whenComplete { [weak self] _ in
            guard let self else { return }
            self.tcpChannels[id] = nil
        }
    }

    // MARK: - Answer side: the flows and splices toward the local services

    func serve(_ service: PeerService, onLocalPort port: UInt16) {
        servedPorts[service.rawValue] = port
        // Splices the peer opened before this side was ready for them (the sender connects as
        // soon as authentication ends; the receiver starts its transfer listener just after).
        let ready = waitingSplices.filter { $0.service == service }
        waitingSplices.removeAll { $0.service == service }
        for splice in ready { openAnswerSplice(id: splice.id, service: service) }
    }

    /// A datagram of the peer's flow `key`: to its socket, opened on the first one.
    private func deliverToFlow(_ key: FlowKey, _ data: ByteBuffer) {
        if let socket = flows.value(for: key, now: coarseNow) {
            guard let channel = socket.channel else {
                if socket.pending.count < Self.pendingPerOpeningFlow { socket.pending.append(data) }
                return
            }
            guard channel.isWritable else { return }
            sendToLocal(socket, address: nil, data, allocator: channel.allocator)
            return
        }
        guard Int(key.service) < servedPorts.count, let port = servedPorts[Int(key.service)], !closing else { return }
        let socket = FlowSocket(key: key)
        guard flows.insert(socket, for: key, now: coarseNow) else { return }
        socket.pending.append(data)
        openFlow(socket, port: port)
    }

    private func openFlow(_ socket: FlowSocket, port: UInt16) {
        let target: SocketAddress
        do { target = try SocketAddress(ipAddress: "127.0.0.1", port: Int(port)) } catch { return }
        DatagramBootstrap(group: eventLoop).connect(to: target).assumeIsolated().whenComplete { [weak self] result in
            guard let self else { return }
            guard case .success(let channel) = result else {
                self.forget(socket)
                return
            }
            // A flow's socket reads one local server's answers to one peer: fewer slots (memory
            // grows with the number of flows).
            guard !socket.closed, !self.closing, (try? Self.tune(channel, pathMTU: false, messagesPerVectorRead: 4)) != nil,
                  (try? channel.pipeline.syncOperations.addHandler(FlowSocketHandler(core: self, socket: socket))) != nil else {
                channel.close(promise: nil)
                self.forget(socket)
                return
            }
            socket.channel = channel
            let pending = socket.pending
            socket.pending = []
            for datagram in pending { channel.write(datagram, promise: nil) }
            channel.flush()
        }
    }

    private func forget(_ socket: FlowSocket) {
        socket.closed = true
        if let current = flows.value(for: socket.key, now: coarseNow), current === socket { _ = flows.remove(socket.key) }
    }

    func flowClosed(_ socket: FlowSocket) {
        socket.channel = nil
        forget(socket)
    }

    /// A reply of the local service to the peer's flow (one datagram, or a coalesced batch).
    func flowRead(_ socket: FlowSocket, _ envelope: AddressedEnvelope<ByteBuffer>) {
        guard envelope.data.readableBytes > 0 else { return }
        flows.touch(socket.key, now: coarseNow)
        DatagramBatches<PeerTarget>.forEachDatagram(in: envelope.data, segmentSize: envelope.metadata?.segmentSize) { datagram in
            sendToPeer(service: socket.key.service, flow: socket.key.flow, datagram)
        }
    }

    private func expireFlows() {
        for front in fronts.compactMap({ $0 }) { _ = front.flows.expire(now: coarseNow) }
        for socket in flows.expire(now: coarseNow) {
            socket.closed = true
            socket.channel?.close(promise: nil)
        }
    }

    /// The peer opened splice `id` for `service`: a TCP connection to the local service, joined
    /// to this side's splice of the same id.
    private func openAnswerSplice(id: Int, service: PeerService) {
        guard !closing, tcpChannels.count < 2 * Self.maximumSplices else { return }
        guard let port = servedPorts[service.rawValue] else {
            // Held for serve(): the relay keeps the peer's half for 10 s.
            if waitingSplices.count < Self.maximumSplices { waitingSplices.append((id, service)) }
            return
        }
        ClientBootstrap(group: eventLoop)
            .channelOption(.autoRead, value: false)
            .channelOption(.allowRemoteHalfClosure, value: true)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .connectTimeout(.seconds(5))
            .connect(host: "127.0.0.1", port: Int(port))
            .assumeIsolated().whenComplete { [weak self] result in
                guard let self else { return }
                guard case .success(let local) = result else { return }
                self.track(local)
                RelaySplice.open(relay: self.relayUDP, bindToken: self.bindToken, id: id, on: self.eventLoop)
                    .assumeIsolated().whenComplete { result in self.joined(local, result) }
            }
    }

    // MARK: - Local flushes

    /// At the end of a read from the peer: one flush per local socket written.
    func flushToLocal() {
        emitToLocal()
        guard !localToFlush.isEmpty else { return }
        for socket in localToFlush {
            socket.flushPending = false
            socket.flushChannel()
        }
        localToFlush.removeAll(keepingCapacity: true)
    }

    // MARK: - Socket options

    /// Messages one `recvmmsg` reads at most.
    static let messagesPerVectorRead = 16
    /// `recvmmsg` calls per readiness of a socket.
    static let vectorReadsPerRead = 4

    /// Large buffers, vectored reads, a bounded write queue; on the wide socket Don't Fragment
    /// (the path's size is QUIC's to find, end to end, as on any path).
    static func tune(_ channel: any Channel, pathMTU: Bool, messagesPerVectorRead: Int = AgentCore.messagesPerVectorRead) throws {
        guard let options = channel.syncOptions else { return }
        func set(_ level: Int32, _ name: Int32, _ value: Int32) -> Bool {
            (try? options.setOption(ChannelOptions.Types.SocketOption(level: SocketOptionLevel(level), name: name), value: SocketOptionValue(value))) != nil
        }
        // Above the system's limit where allowed (SO_RCVBUFFORCE, SO_SNDBUFFORCE), else up to it.
        if !set(SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20) { _ = set(SOL_SOCKET, SO_RCVBUF, 4 << 20) }
        if !set(SOL_SOCKET, SO_SNDBUFFORCE, 4 << 20) { _ = set(SOL_SOCKET, SO_SNDBUF, 4 << 20) }
        try options.setOption(.writeBufferWaterMark, value: .init(low: 512 << 10, high: 2 << 20))
        // Each message's slot takes the largest datagram (NIO splits the buffer evenly, and
        // would hand on a longer datagram cut short).
        try options.setOption(.datagramVectorReadMessageCount, value: messagesPerVectorRead)
        try options.setOption(.maxMessagesPerRead, value: UInt(vectorReadsPerRead))
        try options.setOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: messagesPerVectorRead * 65536))
        // Batches in (GRO) as the stacks send them out (GSO): a read brings up to 64 datagrams
        // in one buffer, with their size.
        try? options.setOption(.datagramReceiveOffload, value: true)
        try? options.setOption(.datagramReceiveSegmentSize, value: true)
        if pathMTU {
            _ = set(Int32(IPPROTO_IP), IP_MTU_DISCOVER, IP_PMTUDISC_PROBE)
            _ = set(Int32(IPPROTO_IPV6), IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE)
        }
    }
}
