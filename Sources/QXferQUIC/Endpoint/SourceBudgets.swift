import QUICEngine

/// Token buckets per source address for the work a listener does on a datagram no connection
/// claims: a connection set-up (Initial decryption, a TLS handshake), a Retry, a Version
/// Negotiation, a stateless reset. A source gets `burst` at once and `perSecond` after, so a
/// flood from one address costs the listener a few comparisons per datagram once its bucket
/// is empty, and it cannot spend the listener-wide answer budgets other sources need.
///
/// A source is an IPv4 address or an IPv6 /64 (ports, and the low half of an IPv6 address,
/// are free for a sender to vary). The buckets live in a fixed table indexed by a keyed hash
/// (`Hasher`, seeded per process), so memory stays bounded whatever the number of sources; a
/// source landing in a slot another source holds takes it over with a fresh bucket, so a
/// collision never locks a newcomer out. Spoofed floods from ever-new addresses are what the
/// listener-wide budgets and Retry are for. Sans-IO: the caller passes the time.
struct SourceBudgets {
    /// A source's key: its address as an IPv6 address (IPv4 mapped), an IPv6 one cut to /64.
    struct Source: Hashable {
        var high: UInt64
        var low: UInt64

        init(_ address: QUICSocketAddress) {
            let bytes = address.addressBytes
            func word(_ start: Int, _ count: Int) -> UInt64 {
                var value: UInt64 = 0
                for index in start..<(start + count) { value = value << 8 | UInt64(bytes[index]) }
                return value
            }
            if bytes.count == 4 {
                (high, low) = (0, 0xffff_0000_0000 | word(0, 4))
            } else {
                high = word(0, 8)
                let isMappedIPv4 = high == 0 && word(8, 4) == 0xffff
                low = isMappedIPv4 ? word(8, 8) : 0
            }
        }
    }

    private struct Slot {
        var source: Source
        /// Credit in nanoseconds of refill: one token is `interval` of it.
        var credit: UInt64
        var refilledAt: UInt64
    }

    let perSecond: Int
    let burst: Int
    private let interval: UInt64
    private var slots: [Slot?]

    /// - Parameters:
    ///   - perSecond: the steady rate per source (at least 1).
    ///   - burst: what an idle source may spend at once (at least 1).
    ///   - slotCount: the size of the table (rounded up to a power of two).
    init(perSecond: Int, burst: Int, slotCount: Int = 2048) {
        self.perSecond = max(perSecond, 1)
        self.burst = max(burst, 1)
        interval = 1_000_000_000 / UInt64(self.perSecond)
        var size = 1
        while size < slotCount { size <<= 1 }
        slots = Array(repeating: nil, count: size)
    }

    /// Takes one token from `address`'s bucket; false (drop the datagram) when it is empty.
    mutating func spend(_ address: QUICSocketAddress, now: QUICTime) -> Bool {
        let source = Source(address)
        let index = source.hashValue & (slots.count - 1)
        let full = UInt64(burst) * interval
        var slot = slots[index] ?? Slot(source: source, credit: full, refilledAt: now.nanoseconds)
        if slot.source != source {
            slot = Slot(source: source, credit: full, refilledAt: now.nanoseconds)
        } else if now.nanoseconds > slot.refilledAt {
            let elapsed = now.nanoseconds - slot.refilledAt
            slot.credit = elapsed >= full ? full : min(full, slot.credit + elapsed)
            slot.refilledAt = now.nanoseconds
        }
        let granted = slot.credit >= interval
        if granted { slot.credit -= interval }
        slots[index] = slot
        return granted
    }
}
