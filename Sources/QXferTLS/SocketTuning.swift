import CQXferLinux
import Logging
import NIOCore
@_spi(Stacks) import QXferCore

#if canImport(Glibc)
import Glibc
#endif

/// Applies the connection parameters to a TCP socket: DSCP, no-delay, keepalive, unsent-data
/// bound, congestion control, fragmentation. Runs in the channel initializer, on the event loop.
enum SocketTuning {
    struct Settings: Sendable {
        var trafficClass: Int32
        var noDelay: Bool
        var notSentLowWatermark: Int32?
        var congestionControl: CongestionControl?
        var keepAlive: TCP.KeepAlive?
        var userTimeout: Duration?
        var allowsFragmentation: Bool?

        init<Stack>(_ parameters: NetworkParameters<Stack>, tcp: TCP) {
            trafficClass = parameters.serviceClass.trafficClass
            switch parameters.performanceMode.kind {
            case .default:
                noDelay = tcp.noDelay ?? true
                notSentLowWatermark = nil
                congestionControl = parameters.congestionControl
            case .bulk:
                noDelay = tcp.noDelay ?? true
                notSentLowWatermark = 1 << 20
                congestionControl = parameters.congestionControl ?? .bbr
            case .realtime:
                noDelay = tcp.noDelay ?? true
                notSentLowWatermark = 16 << 10
                congestionControl = parameters.congestionControl ?? .bbr
            }
            keepAlive = tcp.keepAlive
            userTimeout = tcp.userTimeout
            allowsFragmentation = tcp.ip.allowsFragmentation
        }
    }

    static let logger = Logger(label: "qxfer.tcp")

    /// Sets every option; an option the kernel refuses is logged and skipped, because a
    /// connection without a DSCP mark or BBR still works.
    static func apply(_ settings: Settings, to channel: any Channel) {
        guard let options = channel.syncOptions else { return }
        func set(_ level: Int32, _ name: Int32, _ value: Int32, _ what: String) {
            do {
                try options.setOption(
                    ChannelOptions.Types.SocketOption(level: SocketOptionLevel(level), name: name), value: SocketOptionValue(value))
            } catch {
                logger.debug("socket option \(what)=\(value) not applied: \(error)")
            }
        }
        let family = (try? options.getOption(ChannelOptions.Types.SocketOption(level: SocketOptionLevel(SOL_SOCKET), name: SO_DOMAIN)))
            .map { Int32($0) } ?? AF_INET
        let ipLevel = Int32(IPPROTO_IP), ipv6Level = Int32(IPPROTO_IPV6), tcpLevel = Int32(IPPROTO_TCP)
        if settings.trafficClass != 0 {
            if family == AF_INET6 {
                set(ipv6Level, IPV6_TCLASS, settings.trafficClass, "IPV6_TCLASS")
            }
            set(ipLevel, IP_TOS, settings.trafficClass, "IP_TOS")  // also covers v4-mapped peers
        }
        if let fragments = settings.allowsFragmentation {
            let mode = fragments ? Int32(IP_PMTUDISC_WANT) : Int32(IP_PMTUDISC_DO)
            if family == AF_INET6 { set(ipv6Level, IPV6_MTU_DISCOVER, mode, "IPV6_MTU_DISCOVER") }
            else { set(ipLevel, IP_MTU_DISCOVER, mode, "IP_MTU_DISCOVER") }
        }
        set(tcpLevel, cqxfer_opt_tcp_nodelay(), settings.noDelay ? 1 : 0, "TCP_NODELAY")
        if let lowat = settings.notSentLowWatermark {
            set(tcpLevel, cqxfer_opt_tcp_notsent_lowat(), lowat, "TCP_NOTSENT_LOWAT")
        }
        if let keepAlive = settings.keepAlive {
            set(Int32(SOL_SOCKET), SO_KEEPALIVE, 1, "SO_KEEPALIVE")
            set(tcpLevel, cqxfer_opt_tcp_keepidle(), Int32(keepAlive.idle.components.seconds), "TCP_KEEPIDLE")
            set(tcpLevel, cqxfer_opt_tcp_keepintvl(), Int32(keepAlive.interval.components.seconds), "TCP_KEEPINTVL")
            set(tcpLevel, cqxfer_opt_tcp_keepcnt(), Int32(keepAlive.count), "TCP_KEEPCNT")
        }
        if let timeout = settings.userTimeout {
            let milliseconds = timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000
            set(tcpLevel, cqxfer_opt_tcp_user_timeout(), Int32(clamping: milliseconds), "TCP_USER_TIMEOUT")
        }
        if let algorithm = settings.congestionControl {
            setCongestionControl(algorithm, on: channel)
        }
    }

    /// `TCP_CONGESTION` takes a string, which NIO's typed options cannot express.
    private static func setCongestionControl(_ algorithm: CongestionControl, on channel: any Channel) {
        guard let provider = channel as? any SocketOptionProvider else { return }
        var name = (UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0),
                    UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0), UInt8(0))
        withUnsafeMutableBytes(of: &name) { raw in
            for (index, byte) in algorithm.name.utf8.prefix(Int(CQXFER_TCP_CA_NAME_MAX) - 1).enumerated() {
                raw[index] = byte
            }
        }
        provider.unsafeSetSocketOption(
            level: SocketOptionLevel(IPPROTO_TCP), name: cqxfer_opt_tcp_congestion(), value: name
        ).whenFailure { error in
            logger.debug("congestion control \(algorithm) not available: \(error)")
        }
    }

    /// The socket's `TCP_INFO`; nil if it cannot be read (a closed channel).
    private static func tcpInfo(of channel: any Channel) async -> cqxfer_tcp_info? {
        guard let provider = channel as? any SocketOptionProvider else { return nil }
        let future: EventLoopFuture<cqxfer_tcp_info> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(IPPROTO_TCP), name: cqxfer_opt_tcp_info())
        return try? await future.get()
    }

    /// Bytes written to the socket and not yet acknowledged: those not sent yet, and those
    /// sent (`snd_nxt - snd_una`: sent, less retransmitted, less acknowledged).
    private static func unacknowledgedBytes(_ info: cqxfer_tcp_info) -> Int {
        let (firstSent, wrapped) = info.tcpi_bytes_sent.subtractingReportingOverflow(info.tcpi_bytes_retrans)
        let (inFlight, beyond) = firstSent.subtractingReportingOverflow(info.tcpi_bytes_acked)
        let (total, overflow) = (wrapped || beyond ? 0 : inFlight).addingReportingOverflow(UInt64(info.tcpi_notsent_bytes))
        return overflow ? .max : Int(clamping: total)
    }

    /// ``unacknowledgedBytes(_:)`` of the socket under `channel`; 0 if it cannot be read.
    static func unacknowledgedBytes(of channel: any Channel) async -> Int {
        await tcpInfo(of: channel).map(unacknowledgedBytes) ?? 0
    }

    /// Reads `TCP_INFO` into ``ConnectionMetrics``.
    static func metrics(of channel: any Channel) async -> ConnectionMetrics {
        var metrics = ConnectionMetrics()
        guard let info = await tcpInfo(of: channel) else { return metrics }
        let mss = Int(info.tcpi_snd_mss)
        metrics.smoothedRTT = .microseconds(Int64(info.tcpi_rtt))
        metrics.rttVariance = .microseconds(Int64(info.tcpi_rttvar))
        metrics.minimumRTT = info.tcpi_min_rtt == UInt32.max ? nil : .microseconds(Int64(info.tcpi_min_rtt))
        metrics.congestionWindow = Int(info.tcpi_snd_cwnd) * mss
        metrics.bytesInFlight = Int(info.tcpi_unacked) * mss
        metrics.deliveryRate = Int(info.tcpi_delivery_rate)
        metrics.packetsLost = Int(info.tcpi_lost)
        metrics.packetsRetransmitted = Int(info.tcpi_total_retrans)
        metrics.bytesSent = Int(info.tcpi_bytes_acked)
        metrics.bytesUnacknowledged = unacknowledgedBytes(info)
        metrics.bytesReceived = Int(info.tcpi_bytes_received)
        return metrics
    }
}
