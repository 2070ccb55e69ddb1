import FoundationEssentials
import Glibc
import PlainText

/// What the path is doing, as the transport measures it.
///
/// On TCP this comes from the kernel's `TCP_INFO`; values the transport does not report are nil.
public struct ConnectionMetrics: Sendable, Hashable, CustomStringConvertible {
    /// Smoothed round-trip time.
    public var smoothedRTT: Duration?
    /// Round-trip time variation.
    public var rttVariance: Duration?
    /// Smallest round-trip time seen.
    public var minimumRTT: Duration?
    /// Congestion window, in bytes.
    public var congestionWindow: Int?
    /// Bytes sent and not yet acknowledged.
    public var bytesInFlight: Int?
    /// The most recent delivery-rate estimate, in bytes per second.
    public var deliveryRate: Int?
    /// Packets (segments) considered lost.
    public var packetsLost: Int?
    /// Packets (segments) retransmitted in total.
    public var packetsRetransmitted: Int?
    /// Bytes the transport has sent: on TCP, payload bytes the peer acknowledged
    /// (`tcpi_bytes_acked`); on QUIC, UDP payload bytes handed to the socket, retransmissions
    /// and acknowledgements included.
    public var bytesSent: Int?
    /// Bytes the application wrote that the peer has not acknowledged yet, queued in the
    /// transport or in flight, over all of the connection's streams: what a sender's progress
    /// takes off the bytes it wrote to show what arrived. On TCP+TLS it counts TLS record
    /// bytes, a little more than the payload.
    public var bytesUnacknowledged: Int?
    /// Payload bytes received.
    public var bytesReceived: Int?
    /// The stack carrying the connection ("QUIC", "TCP+TLS"): for a stack racing several,
    /// the one that won.
    public var stack: String?

    public init() {}

    public var description: String {
        func ms(_ d: Duration?) -> String {
            guard let d else { return "-" }
            let (s, attos) = d.components
            return TextFormat.fixed(Double(s) * 1000 + Double(attos) / 1e15, places: 2) + "ms"
        }
        func n(_ v: Int?) -> String { v.map(String.init) ?? "-" }
        return (stack.map { "stack=\($0) " } ?? "") + "srtt=\(ms(smoothedRTT)) rttvar=\(ms(rttVariance)) cwnd=\(n(congestionWindow)) "
            + "inflight=\(n(bytesInFlight)) rate=\(n(deliveryRate))B/s lost=\(n(packetsLost)) "
            + "retrans=\(n(packetsRetransmitted))"
    }
}
