import NIOCore
import NIOPosix
import QUICEngine
@_spi(Stacks) import QXferCore

#if canImport(Glibc)
import Glibc
#endif

/// Before a bulk connection: the largest datagram the path to the server carries, when that is
/// more than ngtcp2 0.12's own path-MTU discovery reaches (``QUICPathProbe/reachedByEngine``).
///
/// From a socket of its own, with Don't Fragment and the kernel's cached path MTU ignored
/// (`IP_PMTUDISC_PROBE`), it sends ``QUICPathProbe``s: one of 1 200 bytes, which every path
/// carries, and one at each size worth having: the largest the route's interface allows and,
/// below a jumbo interface, Ethernet's. Each goes twice, so one lost datagram does not cost
/// the answer. The 1 200-byte answer times the round trip; larger ones get half a round trip
/// more (they take longer to cross a slow link) and ``answerGrace``, and the largest answered
/// size is the result.
/// No answer, an ICMP refusal, or nothing larger answered: nil, and the connection discovers
/// its sizes as ngtcp2 does.
enum PathMTUProbe {
    /// Waiting for the 1 200-byte answer ends after this long (or the caller's limit).
    static let patience: Duration = .seconds(1)

    /// Probes the path to `remote` for at most `limit` (and ``patience``); calls `answered` when
    /// the server first answers. Runs on NIO's blocking thread pool.
    /// Cancelling the task ends the probe within ``cancellationCheckInterval`` (a race won by
    /// another stack must not wait out a silent path's second).
    static func largestDatagram(to remote: SocketAddress, within limit: Duration, answered: @escaping @Sendable () -> Void) async -> Int? {
        let limit = min(limit, patience)
        let cancelled = Locked(false)
        return await withTaskCancellationHandler {
            try? await NIOThreadPool.singleton.runIfActive {
                probe(remote, within: limit, answered: answered, cancelled: { cancelled.withLock { $0 } })
            }
        } onCancel: {
            cancelled.withLock { $0 = true }
        }
    }

    /// What larger probes get beyond half a round trip after the 1 200-byte answer: a busy
    /// receiver may answer them a scheduling slice later (at 2 ms a loaded machine's own
    /// listener missed them). Spent only when the largest size goes unanswered.
    static let answerGrace: Duration = .milliseconds(20)

    /// How often a probe waiting for answers looks whether its task was cancelled.
    static let cancellationCheckInterval: Duration = .milliseconds(20)

    /// The sizes worth probing on a route whose interface MTU is `mtu`: the most it carries and,
    /// below a jumbo interface, Ethernet's; only those above what the engine reaches alone.
    static func candidates(interfaceMTU mtu: Int, ipv6: Bool) -> [Int] {
        let headers = ipv6 ? 48 : 28
        // An IPv4 packet holds at most 65 535 bytes, headers included.
        let largest = min(min(mtu, ipv6 ? Int.max : 65_535) - headers, QUICPathProbe.maximumSize)
        let ethernet = 1500 - headers
        let sizes = largest > ethernet ? [largest, ethernet] : [largest]
        return sizes.filter { $0 > QUICPathProbe.reachedByEngine }
    }

    private static func probe(
        _ remote: SocketAddress, within limit: Duration, answered: @Sendable () -> Void, cancelled: () -> Bool
    ) -> Int? {
        let ipv6 = remote.protocol == .inet6
        let descriptor = socket(ipv6 ? AF_INET6 : AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        let (level, discover, probeMode, mtuOption) = ipv6
            ? (Int32(IPPROTO_IPV6), IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE, IPV6_MTU)
            : (Int32(IPPROTO_IP), IP_MTU_DISCOVER, IP_PMTUDISC_PROBE, IP_MTU)
        var mode = Int32(probeMode)
        guard setsockopt(descriptor, level, discover, &mode, socklen_t(MemoryLayout<Int32>.size)) == 0,
              remote.withSockAddr({ connect(descriptor, $0, socklen_t($1)) }) == 0 else { return nil }
        var mtu: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(descriptor, level, mtuOption, &mtu, &length) == 0 else { return nil }
        let sizes = candidates(interfaceMTU: Int(mtu), ipv6: ipv6)
        guard !sizes.isEmpty else { return nil }

        let reference = QUICPathProbe(size: QUICPathProbe.minimumSize)
        let probes = sizes.map { QUICPathProbe(size: $0) }
        // Smallest first (`sizes` is largest first).
        guard send([reference] + probes.reversed(), on: descriptor) else { return nil }

        let clock = ContinuousClock()
        let start = clock.now
        var deadline = start + limit
        var referenceAnswered = false
        var largestAnswered: Int?
        var reply = [UInt8](repeating: 0, count: 2048)
        while clock.now < deadline, largestAnswered != sizes[0] {
            if cancelled() { return nil }
            var pollDescriptor = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            let wait = min(deadline - clock.now, cancellationCheckInterval)
            let milliseconds = Int32(clamping: wait.components.seconds * 1000 + wait.components.attoseconds / 1_000_000_000_000_000 + 1)
            guard poll(&pollDescriptor, 1, milliseconds) >= 0 || errno == EINTR else { return nil }
            while true {
                let count = reply.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
                if count < 0 {
                    if errno == EINTR { continue }
                    if errno == EAGAIN || errno == EWOULDBLOCK { break }
                    if errno == ECONNREFUSED { return nil }  // nobody listens on UDP there
                    continue  // EMSGSIZE: a router's "too big" for a probe, an answer in itself
                }
                let (isReference, size) = reply.withUnsafeBytes { raw -> (Bool, Int?) in
                    let answer = UnsafeRawBufferPointer(rebasing: raw.prefix(count))
                    return (reference.isAnswered(by: answer), probes.first { $0.isAnswered(by: answer) }?.size)
                }
                if (isReference || size != nil) && !referenceAnswered && largestAnswered == nil { answered() }
                if isReference, !referenceAnswered {
                    referenceAnswered = true
                    let now = clock.now
                    deadline = min(deadline, now + (now - start) / 2 + answerGrace)
                }
                if let size { largestAnswered = max(largestAnswered ?? 0, size) }
            }
        }
        return largestAnswered
    }

    /// Sends each probe twice, in the order given; false if the peer refused (ICMP port
    /// unreachable), which a failed send reports once and recv then never again. A router's
    /// "too big" for one probe is reported to the next send (EMSGSIZE, that datagram not sent),
    /// which is therefore tried once more.
    private static func send(_ probes: [QUICPathProbe], on descriptor: Int32) -> Bool {
        for _ in 0..<2 {
            for probe in probes {
                for _ in 0..<2 {
                    if probe.datagram.withUnsafeBytes({ Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) >= 0 { break }
                    if errno == ECONNREFUSED { return false }
                }
            }
        }
        return true
    }
}
