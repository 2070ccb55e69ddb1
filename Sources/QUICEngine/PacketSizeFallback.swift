/// Falls back to QUIC's smallest packets when larger ones stop getting through: a path whose
/// MTU dropped under an established connection (a route moved into a tunnel, a VPN came up),
/// where every full-size packet is dropped and only ICMP, which QUIC ignores, says why.
///
/// ngtcp2 0.12 raises the packet size (its PMTUD, or qxfer's own probe before the handshake)
/// but never lowers it: without this the connection sent full-size packets into the hole
/// until the peer's idle timeout, while TCP on the same path lowers its segments from the ICMP
/// and goes on. RFC 8899 §4.3 calls this black-hole detection.
///
/// The signal is two probe timeouts in a row with nothing acknowledged: the probes ngtcp2
/// sends after the first timeout were full-size and lost too, which random loss almost never
/// does to both. Packets are then held to ``fallbackSize``, which every QUIC path carries
/// (RFC 9000 §14), so the next probes get through and ngtcp2 retransmits what was lost in
/// packets of that size. An outage looks the same, so the limit is lifted after a hold that
/// starts at ``initialHold`` and doubles each time the signal returns, up to ``longestHold``:
/// a brief outage costs seconds of smaller packets, a lasting hole a stall of two probe
/// timeouts each hold.
struct PacketSizeFallback {
    /// The largest UDP payload every QUIC path must carry (RFC 9000 §14).
    static let fallbackSize = 1200
    static let initialHold = Duration.seconds(10)
    static let longestHold = Duration.seconds(300)

    /// The most bytes a packet may have now; nil when only the path's own size applies.
    private(set) var ceiling: Int?
    private var liftAt = QUICTime(nanoseconds: 0)
    private var hold = initialHold

    /// What changed, for the connection to report.
    enum Change: Equatable {
        case limited(to: Int)
        case lifted
    }

    /// Looks at the connection's state before it writes packets.
    /// - Parameters:
    ///   - packetSize: the largest UDP payload the path's size allows now.
    ///   - probeTimeouts: probe timeouts since the last acknowledgement (`pto_count`).
    mutating func update(packetSize: Int, probeTimeouts: Int, now: QUICTime) -> Change? {
        if ceiling != nil {
            // Lifted only while packets are acknowledged: during an outage that outlasts the
            // hold, full-size packets would only be lost again.
            guard probeTimeouts == 0, now >= liftAt else { return nil }
            ceiling = nil
            return .lifted
        }
        guard probeTimeouts >= 2, packetSize > Self.fallbackSize else { return nil }
        ceiling = Self.fallbackSize
        liftAt = now.advanced(by: hold)
        hold = min(hold * 2, Self.longestHold)
        return .limited(to: Self.fallbackSize)
    }

    /// `size` under the ceiling.
    func limit(_ size: Int) -> Int {
        ceiling.map { min($0, size) } ?? size
    }
}
