/// A protocol stack plus the path-level choices that go with it.
///
/// ```swift
/// NetworkConnection(to: peer, using: .parameters { TLS() }
///     .serviceClass(.interactiveVideo)
///     .performanceMode(.realtime))
/// ```
public struct NetworkParameters<Stack: NetworkProtocolStack>: Sendable {
    /// The protocol stack.
    public var stack: Stack
    /// The DSCP mark on outgoing packets.
    public var serviceClass: ServiceClass = .bestEffort
    /// Socket buffers, latency options and congestion control as a bundle.
    public var performanceMode: PerformanceMode = .default
    /// The congestion controller; nil lets the performance mode choose.
    public var congestionControl: CongestionControl?
    /// Closes a connection on which nothing was sent or received for this long; nil never does.
    ///
    /// On QUIC, nil keeps the path alive with a PING every 10 s and ends the connection when the
    /// peer has been silent for 30 s; a peer that asks for a shorter idle timeout gets it (the
    /// PINGs stop). The effective timeout is never under three probe timeouts, and on QUIC it
    /// also bounds silence during the handshake (RFC 9000 §10.1); on TCP+TLS it starts once the
    /// handshake is done.
    public var idleTimeout: Duration?
    /// How long a connection may take to become ready, retries included, before it fails.
    public var connectTimeout: Duration = .seconds(10)
    /// A fingerprint the server must present; overrides the stack's trust settings.
    public var peerFingerprint: Fingerprint?

    /// Parameters for a stack given by a declaration.
    public static func parameters(@NetworkStackBuilder _ stack: () -> Stack) -> NetworkParameters<Stack> {
        NetworkParameters(stack: stack())
    }

    /// Parameters for a stack value.
    public init(stack: Stack) { self.stack = stack }

    /// Marks packets with this service class (DSCP in `IP_TOS` / `IPV6_TCLASS`).
    public func serviceClass(_ serviceClass: ServiceClass) -> Self { with { $0.serviceClass = serviceClass } }
    /// Tunes the path for bulk throughput or for low latency.
    public func performanceMode(_ mode: PerformanceMode) -> Self { with { $0.performanceMode = mode } }
    /// Chooses the congestion controller.
    public func congestionControl(_ algorithm: CongestionControl) -> Self { with { $0.congestionControl = algorithm } }
    /// Closes the connection after this long without traffic.
    public func idleTimeout(_ timeout: Duration?) -> Self { with { $0.idleTimeout = timeout } }
    /// Bounds the time to become ready.
    public func connectTimeout(_ timeout: Duration) -> Self { with { $0.connectTimeout = timeout } }
    /// Pins the server's certificate fingerprint.
    public func peerFingerprint(_ fingerprint: Fingerprint) -> Self { with { $0.peerFingerprint = fingerprint } }

    private func with(_ change: (inout Self) -> Void) -> Self {
        var copy = self
        change(&copy)
        return copy
    }
}

/// The kind of traffic, mapped to a DSCP code point (RFC 4594) on every packet.
public struct ServiceClass: Sendable, Hashable, CustomStringConvertible {
    /// The 6-bit DSCP value.
    public let dscp: UInt8
    public let description: String

    /// Default forwarding (DSCP 0).
    public static let bestEffort = ServiceClass(dscp: 0, description: "best-effort")
    /// Lower than best effort, for transfers nobody waits on (CS1).
    public static let background = ServiceClass(dscp: 8, description: "background")
    /// Bulk data someone waits on (AF11).
    public static let bulkData = ServiceClass(dscp: 10, description: "bulk-data")
    /// Short transactions that should feel instant (AF21).
    public static let responsiveData = ServiceClass(dscp: 18, description: "responsive-data")
    /// Live video (AF41).
    public static let interactiveVideo = ServiceClass(dscp: 34, description: "interactive-video")
    /// Live voice (EF).
    public static let interactiveVoice = ServiceClass(dscp: 46, description: "interactive-voice")

    /// The byte for `IP_TOS` / `IPV6_TCLASS`: DSCP in the upper six bits, ECN bits clear.
    @_spi(Stacks) public var trafficClass: Int32 { Int32(dscp) << 2 }
}

/// What the path should be good at.
public struct PerformanceMode: Sendable, Hashable, CustomStringConvertible {
    @_spi(Stacks) public enum Kind: Sendable, Hashable { case `default`, bulk, realtime }
    @_spi(Stacks) public let kind: Kind
    public var description: String { "\(kind)" }

    /// The operating system's defaults.
    public static let `default` = PerformanceMode(kind: .default)
    /// Throughput: on TCP, BBR, `TCP_NODELAY`, and a bounded amount of unsent data in the kernel
    /// (`TCP_NOTSENT_LOWAT` 1 MiB) so backpressure reaches the application promptly; on QUIC,
    /// BBR v2, windows and send buffers sized for long lossy paths, and on a long path a socket
    /// that reads in groups (after a read that emptied it, a pause of 1/50 of the RTT, at most
    /// 4 ms), which spares a wake-up per packet at the cost of at most 2 % of an RTT.
    public static let bulk = PerformanceMode(kind: .bulk)
    /// Latency: on TCP, BBR, `TCP_NODELAY` and `TCP_NOTSENT_LOWAT` 16 KiB, so a frame never
    /// waits behind a deep kernel queue; on QUIC, BBR v2, which does not shrink the window of
    /// an application-limited flow at every loss as BBR v1 does.
    public static let realtime = PerformanceMode(kind: .realtime)
}

/// A congestion-control algorithm.
public struct CongestionControl: Sendable, Hashable, CustomStringConvertible {
    /// The algorithm's name as Linux knows it (`TCP_CONGESTION`).
    public let name: String
    public var description: String { name }

    /// CUBIC (RFC 9438), Linux's default.
    public static let cubic = CongestionControl(name: "cubic")
    /// BBR: paces at the measured bottleneck rate; holds up under random loss.
    public static let bbr = CongestionControl(name: "bbr")
    /// NewReno (RFC 6582).
    public static let reno = CongestionControl(name: "reno")
    /// BBR v2: also reacts to loss, but only above 2 % in a round. QUIC only (Linux's TCP has no
    /// `bbr2`; there the socket keeps its default). QUIC's choice for `.performanceMode(.realtime)`
    /// and `.bulk`.
    public static let bbr2 = CongestionControl(name: "bbr2")
}
