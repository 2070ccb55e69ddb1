import FoundationEssentials
import Glibc
import NIOCore
import NIOPosix
import Synchronization

/// A relay (docs/PROTOCOL.md §9.2-9.4, docs/RELAY.md): pairs two clients by room, tells each
/// the address it sees them from, carries their signals, forwards their datagrams between
/// bound seats and splices their TCP connections. It holds no secret and sees only rooms
/// (hashes), addresses and ciphertext.
///
/// One port number serves TCP (control connections and splices) and UDP (datagrams). All of
/// it runs on one event loop thread: the room table is touched only there, without locks, and
/// one thread forwards a gigabit of datagrams (docs/RELAY.md, "Cost").
///
/// ```swift
/// let relay = RelayServer(host: nil, port: 7450)
/// try await relay.run { port in print("relay: listening on \(port)") }  // until cancelled
/// ```
public final class RelayServer: Sendable {
    /// The port a relay listens on unless told otherwise, TCP and UDP alike.
    public static let defaultPort: UInt16 = 7450

    /// The address listened on; nil for every address (IPv6 and IPv4 where the host has both).
    public let host: String?
    /// The port asked for; 0 for an ephemeral one (the same number for TCP and UDP).
    public let port: UInt16
    /// What each client and all of them together may hold.
    public let limits: RelayLimits

    private let board = StatisticsBoard()

    /// - Parameters:
    ///   - host: the address to listen on; nil for every address.
    ///   - port: the port for TCP and UDP; 0 picks one free for both.
    ///   - limits: the bounds (docs/RELAY.md, "Limits").
    public init(host: String? = nil, port: UInt16 = RelayServer.defaultPort, limits: RelayLimits = .default) {
        self.host = host
        self.port = port
        self.limits = limits.sanitized
    }

    /// What the relay has done and holds, as of its last event (at most a second old).
    public var statistics: RelayStatistics { board.value.withLock { $0 } }

    /// Listens and serves until the calling task is cancelled, then closes every socket and
    /// returns. Throws ``ReachError`` (`.local`) if the port cannot be had for both TCP and UDP,
    /// or if the listening socket fails.
    /// - Parameter started: called once both sockets listen, with their port number.
    public func run(started: @Sendable (UInt16) async -> Void) async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let limits = limits
        let publish: @Sendable (RelayStatistics) -> Void = { [board] statistics in board.value.withLock { $0 = statistics } }
        let core = try await loop.submit {
            NIOLoopBound(RelayCore(rooms: RelayRooms(limits: limits), publish: publish), eventLoop: loop)
        }.get()
        var failure: (any Error)?
        do {
            let sockets = try await RelaySockets.bind(host: host, port: port, on: loop, core: core)
            try await serve(sockets, core: core, on: loop, started: started)
        } catch {
            failure = error
        }
        try? await loop.submit { core.value.closeEverything() }.get()
        try? await group.shutdownGracefully()
        if let failure, !(failure is CancellationError) { throw failure }
    }

    private func serve(_ sockets: RelaySockets, core: NIOLoopBound<RelayCore>, on loop: any EventLoop,
                       started: @Sendable (UInt16) async -> Void) async throws {
        let ticker = loop.scheduleRepeatedTask(initialDelay: .seconds(1), delay: .seconds(1)) { _ in core.value.tick() }
        defer { ticker.cancel() }
        let listener = sockets.listener
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await withTaskCancellationHandler {
                    try await listener.closeFuture.get()
                } onCancel: {
                    listener.close(promise: nil)
                }
                if !Task.isCancelled { throw ReachError(.local, "the relay's TCP socket on port \(sockets.port) closed") }
            }
            group.addTask { try await sockets.keepDatagramSocket(on: loop, core: core) }
            await started(sockets.port)
            try await group.next()
            group.cancelAll()
        }
    }
}

/// The statistics the event loop publishes and any task reads.
private final class StatisticsBoard: Sendable {
    let value = Mutex(RelayStatistics())
}

/// The relay's two sockets on one port number.
struct RelaySockets: Sendable {
    let listener: any Channel
    let datagrams: any Channel
    /// The address bound ("::", "0.0.0.0" or the one asked for).
    let host: String
    let port: UInt16

    /// Attempts at an ephemeral port whose number UDP also has free.
    private static let ephemeralAttempts = 8

    /// Binds TCP, then UDP on the same number: with no host, IPv6's `::` (which takes IPv4 too)
    /// or, where the host has no IPv6, `0.0.0.0`.
    static func bind(host: String?, port: UInt16, on loop: any EventLoop, core: NIOLoopBound<RelayCore>) async throws -> RelaySockets {
        var lastError: (any Error)?
        for candidate in host.map({ [$0] }) ?? ["::", "0.0.0.0"] {
            for _ in 0..<(port == 0 ? ephemeralAttempts : 1) {
                let listener: any Channel
                do {
                    listener = try await listenerBootstrap(on: loop, core: core).bind(host: candidate, port: Int(port)).get()
                } catch {
                    lastError = error
                    break
                }
                let bound = UInt16(clamping: listener.localAddress?.port ?? Int(port))
                do {
                    let datagrams = try await datagramBootstrap(on: loop, core: core).bind(host: candidate, port: Int(bound)).get()
                    return RelaySockets(listener: listener, datagrams: datagrams, host: candidate, port: bound)
                } catch {
                    // Another program has this number's UDP side: an ephemeral port tries another.
                    lastError = error
                    try? await listener.close()
                }
            }
        }
        let reason = lastError.map(Self.reason) ?? "no address to listen on"
        throw ReachError(.local, "cannot listen on \(host ?? "every address") port \(port) (TCP and UDP): \(reason)")
    }

    /// Watches the UDP socket and binds the same port again if NIO closes it under the relay
    /// (it does when a send fails with an error it deems fatal, such as EPERM from a local
    /// firewall); returns when cancelled, closing it.
    func keepDatagramSocket(on loop: any EventLoop, core: NIOLoopBound<RelayCore>) async throws {
        var socket = datagrams
        while true {
            let current = socket
            try? await withTaskCancellationHandler {
                try await current.closeFuture.get()
            } onCancel: {
                current.close(promise: nil)
            }
            try Task.checkCancellation()
            var attempts = 0
            while true {
                do {
                    socket = try await Self.datagramBootstrap(on: loop, core: core).bind(host: host, port: Int(port)).get()
                    break
                } catch {
                    attempts += 1
                    if attempts >= 50 { throw ReachError(.local, "the relay's UDP socket on port \(port) closed and cannot be opened again: \(Self.reason(error))") }
                    try await Task.sleep(for: .milliseconds(100))
                }
            }
        }
    }

    private static func listenerBootstrap(on loop: any EventLoop, core: NIOLoopBound<RelayCore>) -> ServerBootstrap {
        ServerBootstrap(group: loop)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            // A splice passes one side's end of data on as a half-close and keeps the other way open.
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            // What a splice holds for a peer that reads slower than the other side writes.
            .childChannelOption(.writeBufferWaterMark, value: .init(low: 128 << 10, high: 512 << 10))
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RelayConnectionHandler(core: core.value))
                }
            }
    }

    /// Datagrams in a `recvmmsg` read.
    static let messagesPerVectorRead = 16

    private static func datagramBootstrap(on loop: any EventLoop, core: NIOLoopBound<RelayCore>) -> DatagramBootstrap {
        // No SO_REUSEADDR: on UDP it would let a second socket share the port and split the traffic.
        DatagramBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let options = channel.syncOptions {
                        // Room for a burst while the loop relays the batch before it.
                        try? options.setOption(.socketOption(.so_rcvbuf), value: 4 << 20)
                        try? options.setOption(.socketOption(.so_sndbuf), value: 4 << 20)
                        // Coalesced reads (UDP GRO) where the kernel has them: a sender's burst
                        // arrives as one message and leaves as one GSO send (RelayDatagramHandler).
                        try? options.setOption(.datagramReceiveOffload, value: true)
                        try? options.setOption(.datagramReceiveSegmentSize, value: true)
                        // Vectored reads: each message needs room for the largest datagram or
                        // GRO batch, 64 KiB.
                        try options.setOption(.datagramVectorReadMessageCount, value: messagesPerVectorRead)
                        try options.setOption(.maxMessagesPerRead, value: 4)
                        try options.setOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: messagesPerVectorRead * 65536))
                        // Past this much unsent, datagrams are dropped rather than queued.
                        try options.setOption(.writeBufferWaterMark, value: .init(low: 1 << 20, high: 2 << 20))
                    }
                    try channel.pipeline.syncOperations.addHandler(RelayDatagramHandler(core: core.value))
                }
            }
    }

    static func reason(_ error: any Error) -> String {
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        return "\(error)"
    }
}

/// The room table and the connections' handlers, confined to the relay's event loop.
final class RelayCore {
    var rooms: RelayRooms
    /// Whether datagrams to one peer leave in GSO sends; false once the kernel refused one.
    var datagramBatching = true
    private var handlers: [RelayConnectionID: RelayConnectionHandler] = [:]
    private let publish: @Sendable (RelayStatistics) -> Void

    init(rooms: RelayRooms, publish: @escaping @Sendable (RelayStatistics) -> Void) {
        self.rooms = rooms
        self.publish = publish
    }

    /// A new TCP connection: its id, or nil if it is refused (the reason is what to write).
    func admit(_ handler: RelayConnectionHandler, from address: ClientAddress) -> Result<RelayConnectionID, RelayRefused> {
        switch rooms.connectionOpened(from: address, now: .now) {
        case .admitted(let id):
            handlers[id] = handler
            publishStatistics()
            return .success(id)
        case .refused(let reason):
            publishStatistics()
            return .failure(RelayRefused(reason: reason))
        }
    }

    func received(_ message: RelayMessage, on id: RelayConnectionID) {
        perform(rooms.received(message, on: id, now: .now))
    }

    func violation(on id: RelayConnectionID, _ what: String) {
        perform(rooms.violation(on: id, what))
    }

    func closed(_ id: RelayConnectionID) {
        handlers[id] = nil
        perform(rooms.connectionClosed(id, now: .now))
    }

    func tick() {
        perform(rooms.tick(now: .now))
    }

    func perform(_ actions: [RelayAction]) {
        for action in actions {
            switch action {
            case .send(let message, let id):
                handlers[id]?.send(message)
            case .close(let id):
                handlers[id]?.closeAfterWrites()
            case .splice(let first, let second):
                guard let firstHandler = handlers[first], let secondHandler = handlers[second] else { continue }
                firstHandler.startSplice(with: secondHandler)
                secondHandler.startSplice(with: firstHandler)
            }
        }
        publishStatistics()
    }

    func publishStatistics() {
        publish(rooms.statistics)
    }

    func closeEverything() {
        for handler in handlers.values { handler.closeNow() }
    }
}

/// Why a new connection was turned away.
struct RelayRefused: Error {
    let reason: String
}

extension ClientAddress {
    /// The address of a socket address; nil for a Unix domain socket.
    init?(_ address: SocketAddress) {
        switch address {
        case .v4(let v4):
            self.init(ipv4: UInt32(bigEndian: v4.address.sin_addr.s_addr), port: UInt16(bigEndian: v4.address.sin_port))
        case .v6(let v6):
            var raw = v6.address.sin6_addr
            let (high, low) = withUnsafeBytes(of: &raw) {
                (UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
                 UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
            }
            self.init(ipv6High: high, low: low, port: UInt16(bigEndian: v6.address.sin6_port))
        default:
            return nil
        }
    }

    /// The socket address to send to from a socket of that family (an IPv6 socket reaches an
    /// IPv4 client at its mapped address); nil for an IPv6 address from an IPv4 socket.
    func socketAddress(fromIPv6Socket ipv6: Bool) -> SocketAddress? {
        if ipv6 {
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = port.bigEndian
            withUnsafeMutableBytes(of: &address.sin6_addr) {
                $0.storeBytes(of: high.bigEndian, toByteOffset: 0, as: UInt64.self)
                $0.storeBytes(of: low.bigEndian, toByteOffset: 8, as: UInt64.self)
            }
            return SocketAddress(address, host: "")
        }
        guard let ipv4 else { return nil }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = ipv4.bigEndian
        return SocketAddress(address, host: "")
    }
}
