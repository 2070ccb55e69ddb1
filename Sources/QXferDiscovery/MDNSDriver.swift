import Logging
import NIOCore
import NIOPosix
@_spi(Stacks) import QXferCore

#if canImport(Glibc)
import Glibc
#endif

/// Runs one multicast DNS state machine on NIO datagram channels, all on one event loop: the
/// machine decides, the driver only reads, writes and keeps the one timer the machine asks for.
final class MDNSDriver<Machine: MDNSStateMachine> {
    private var machine: Machine
    private let eventLoop: any EventLoop
    private var channels: [(interfaceIndex: Int, ipv6: Bool, channel: any Channel)] = []
    private var timer: Scheduled<Void>?
    private var timerDeadline: NIODeadline?
    private var stopped = false
    private var usableIPv6: (interfaces: Set<Int>, checked: NIODeadline)?
    /// Called on the event loop after every input, so the owner can read the machine's state.
    private let observe: @Sendable (inout Machine) -> Void
    /// Packets that failed to parse (each was dropped and changed nothing).
    private(set) var droppedPackets = 0
    private static var logger: Logger { Logger(label: "qxfer.discovery") }

    init(machine: Machine, eventLoop: any EventLoop, observe: @escaping @Sendable (inout Machine) -> Void) {
        self.machine = machine
        self.eventLoop = eventLoop
        self.observe = observe
    }

    func start(channels: [(interfaceIndex: Int, ipv6: Bool, channel: any Channel)]) {
        self.channels = channels
        machine.start(now: .now())
        afterInput()
    }

    func received(_ envelope: AddressedEnvelope<ByteBuffer>, interfaceIndex: Int) {
        guard !stopped else { return }
        let bytes = Array(envelope.data.readableBytesView)
        let message: DNSMessage
        do {
            message = try DNSMessage(parsing: bytes)
        } catch {
            droppedPackets += 1
            Self.logger.debug("dropped a packet from \(envelope.remoteAddress): \(error)")
            return
        }
        guard let source = Self.source(envelope.remoteAddress, interfaceIndex: interfaceIndex) else { return }
        Self.logger.debug("mDNS from \(envelope.remoteAddress): \(Self.summary(of: message))")
        machine.receive(message, from: source, now: .now())
        afterInput()
    }

    /// "query _qxfer._udp.local PTR" or "response: name TYPE, …", for the -vv log.
    static func summary(of message: DNSMessage) -> String {
        let questions = message.questions.map { "\($0.name) \($0.type)" }
        let records = (message.answers + message.additionals).map { "\($0.name) \($0.type)" }
        return message.isResponse ? "response: " + records.joined(separator: ", ") : "query " + (questions + records.map { "known " + $0 }).joined(separator: ", ")
    }

    /// How long the goodbyes may take to leave before the sockets close anyway: a socket that
    /// never becomes writable again (its interface gone) must not hold a process's exit.
    static var goodbyeTimeout: TimeAmount { .seconds(1) }

    /// Lets the machine say its last words (goodbyes), sends them (for at most
    /// ``goodbyeTimeout``), then closes every socket.
    func shutdown() -> EventLoopFuture<Void> {
        guard !stopped else {
            return EventLoopFuture.andAllComplete(channels.map { $0.channel.closeFuture }, on: eventLoop)
        }
        machine.stop(now: .now())
        let writes = flushOutgoing()
        observe(&machine)
        stopped = true
        timer?.cancel()
        timer = nil
        let channels = self.channels.map(\.channel)
        let eventLoop = self.eventLoop
        // Closing a socket fails the writes still waiting on it, which ends the wait below.
        let closeAnyway = eventLoop.scheduleTask(in: Self.goodbyeTimeout) {
            for channel in channels { channel.close(promise: nil) }
        }
        return EventLoopFuture.andAllComplete(writes, on: eventLoop).flatMap {
            closeAnyway.cancel()
            return EventLoopFuture.andAllComplete(channels.map { $0.close() }, on: eventLoop)
        }
    }

    private func tick() {
        timer = nil
        timerDeadline = nil
        guard !stopped else { return }
        machine.tick(now: .now())
        afterInput()
    }

    private func afterInput() {
        _ = flushOutgoing()
        observe(&machine)
        guard !stopped else { return }
        let deadline = machine.nextDeadline
        guard deadline != timerDeadline else { return }
        timer?.cancel()
        timerDeadline = deadline
        if let deadline {
            timer = eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [self] in tick() }
        }
    }

    @discardableResult
    private func flushOutgoing() -> [EventLoopFuture<Void>] {
        var writes: [EventLoopFuture<Void>] = []
        for outgoing in machine.takeOutgoing() {
            let bytes = outgoing.message.encoded
            // A socket an error closed is skipped; the other family keeps the interface served.
            for entry in channels where entry.interfaceIndex == outgoing.interfaceIndex && entry.channel.isActive {
                if entry.ipv6 && !ipv6IsUsable(on: entry.interfaceIndex) { continue }
                let destination: SocketAddress?
                switch outgoing.destination {
                case .multicast:
                    destination = Self.address(entry.ipv6 ? MDNS.ipv6Group : MDNS.ipv4Group, port: MDNS.port, scope: outgoing.interfaceIndex)
                case .unicast(let address, let port):
                    guard (address.count == 16) == entry.ipv6 else { continue }
                    destination = Self.address(address, port: port, scope: outgoing.interfaceIndex)
                }
                guard let destination else { continue }
                Self.logger.debug("mDNS to \(destination): \(Self.summary(of: outgoing.message))")
                let envelope = AddressedEnvelope(remoteAddress: destination, data: entry.channel.allocator.buffer(bytes: bytes))
                let promise = eventLoop.makePromise(of: Void.self)
                entry.channel.writeAndFlush(envelope, promise: promise)
                // A send can fail while an IPv6 address is still tentative; the next one may not.
                writes.append(promise.futureResult.flatMapErrorThrowing { error in
                    Self.logger.debug("mDNS send to \(destination) failed: \(error)")
                })
            }
        }
        return writes
    }

    /// Whether the interface has an IPv6 address past duplicate address detection (checked at
    /// most once a second).
    private func ipv6IsUsable(on interfaceIndex: Int) -> Bool {
        let now = NIODeadline.now()
        if usableIPv6 == nil || now - usableIPv6!.checked > .seconds(1) {
            usableIPv6 = (MDNSSockets.interfacesWithUsableIPv6(), now)
        }
        return usableIPv6!.interfaces.contains(interfaceIndex)
    }

    static func address(_ bytes: [UInt8], port: UInt16, scope: Int) -> SocketAddress? {
        if bytes.count == 4 {
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            withUnsafeMutableBytes(of: &address.sin_addr) { $0.copyBytes(from: bytes) }
            return SocketAddress(address, host: "")
        }
        guard bytes.count == 16 else { return nil }
        var address = sockaddr_in6()
        address.sin6_family = sa_family_t(AF_INET6)
        address.sin6_port = port.bigEndian
        address.sin6_scope_id = UInt32(scope)
        withUnsafeMutableBytes(of: &address.sin6_addr) { $0.copyBytes(from: bytes) }
        return SocketAddress(address, host: "")
    }

    static func source(_ address: SocketAddress, interfaceIndex: Int) -> MDNSSource? {
        switch address {
        case .v4(let v4):
            let bytes = withUnsafeBytes(of: v4.address.sin_addr) { Array($0) }
            return MDNSSource(interfaceIndex: interfaceIndex, address: bytes, port: UInt16(bigEndian: v4.address.sin_port))
        case .v6(let v6):
            let bytes = withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) }
            return MDNSSource(interfaceIndex: interfaceIndex, address: bytes, port: UInt16(bigEndian: v6.address.sin6_port))
        default:
            return nil
        }
    }
}

/// Hands each datagram to the driver with the interface its socket is tied to.
final class MDNSInboundHandler<Machine: MDNSStateMachine>: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    private let driver: NIOLoopBound<MDNSDriver<Machine>>
    private let interfaceIndex: Int

    init(driver: NIOLoopBound<MDNSDriver<Machine>>, interfaceIndex: Int) {
        self.driver = driver
        self.interfaceIndex = interfaceIndex
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        driver.value.received(unwrapInboundIn(data), interfaceIndex: interfaceIndex)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ICMP errors and the like say nothing about the link as a whole: keep the socket.
    }
}

/// A running machine: its sockets are open until ``shutdown()``.
struct MDNSSession<Machine: MDNSStateMachine>: Sendable {
    private let driver: NIOLoopBound<MDNSDriver<Machine>>
    private static var logger: Logger { Logger(label: "qxfer.discovery") }

    /// Opens a socket per interface and family and starts `machine`. `observe` runs on the
    /// event loop after every input. Fails only if no socket at all could be opened.
    static func open(
        _ machine: Machine, interfaces: [MDNSInterface], port: UInt16 = MDNS.port,
        observe: @escaping @Sendable (inout Machine) -> Void
    ) async throws -> MDNSSession {
        let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        let driver = try await eventLoop.submit {
            NIOLoopBound(MDNSDriver(machine: machine, eventLoop: eventLoop, observe: observe), eventLoop: eventLoop)
        }.get()
        var channels: [(interfaceIndex: Int, ipv6: Bool, channel: any Channel)] = []
        var failures: [String] = []
        for interface in interfaces {
            for ipv6 in [false, true] where !(ipv6 ? interface.ipv6 : interface.ipv4).isEmpty {
                let fd: CInt
                do {
                    fd = try MDNSSockets.open(on: interface, ipv6: ipv6, port: port)
                } catch {
                    failures.append("\(error)")
                    continue
                }
                let index = interface.index
                do {
                    // NIO owns the descriptor from here on and closes it, even on failure.
                    let channel = try await DatagramBootstrap(group: eventLoop)
                        .channelInitializer { channel in
                            channel.eventLoop.makeCompletedFuture {
                                try channel.pipeline.syncOperations.addHandler(MDNSInboundHandler(driver: driver, interfaceIndex: index))
                            }
                        }
                        .withBoundSocket(fd).get()
                    channels.append((index, ipv6, channel))
                } catch {
                    failures.append("\(interface.name): \(error)")
                }
            }
        }
        guard !channels.isEmpty else {
            let names = interfaces.map(\.name).joined(separator: ", ")
            throw QXferError(
                .bindFailed,
                interfaces.isEmpty
                    ? "multicast DNS: no network interface is up with multicast"
                    : "multicast DNS: no socket on \(names): \(failures.joined(separator: "; "))")
        }
        for failure in failures { logger.debug("multicast DNS: \(failure)") }
        let opened = channels
        try await eventLoop.submit { driver.value.start(channels: opened) }.get()
        return MDNSSession(driver: driver)
    }

    /// Stops the machine (goodbyes go out first) and closes every socket.
    func shutdown() async {
        let driver = self.driver
        try? await driver.eventLoop.flatSubmit { driver.value.shutdown() }.get()
    }

    /// Packets dropped as malformed so far.
    var droppedPackets: Int {
        get async {
            let driver = self.driver
            return (try? await driver.eventLoop.submit { driver.value.droppedPackets }.get()) ?? 0
        }
    }
}
