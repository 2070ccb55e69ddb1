internal import LinuxSystem
internal import PlainText

/// The memory a receiver lets the offers of all its connections take at once.
///
/// One Offer is bounded (256 MiB in parts, 1 000 000 entries: docs/PROTOCOL.md §4), but what it
/// costs to hold is about twelve times its bytes once decoded, checked and planned (an Offer of
/// 1 000 000 one-byte files, 33 MB, took an idle receiver from 27 to 392 MiB), and anyone may
/// connect and offer before a person is asked. Eight such offers at once took 747 MiB; nothing
/// bounded how many. Each connection's offer now reserves ``bytesHeldPerOfferByte`` for every
/// byte of it as its parts arrive, and keeps the reservation until its transfer ends.
final class OfferMemory: Sendable {
    /// What holding one byte of an Offer costs, decoded and planned, with a margin (twelve
    /// measured, for one-byte names and for 120-byte paths alike).
    static let bytesHeldPerOfferByte = 16

    /// The most all offers may hold at once.
    let limit: Int
    private let held = Locked(0)

    /// A quarter of the memory this process can have (``UsableMemory``), at least 256 MiB and
    /// at most 4 GiB: the largest Offer qxfer/1 allows (256 MiB) fits alone on a machine of 16 GiB.
    static var defaultLimit: Int { UsableMemory.share(1, of: 4, atLeast: 256 << 20, atMost: 4 << 30) }

    init(limit: Int = OfferMemory.defaultLimit) { self.limit = limit }

    /// One offer's share, released when the value goes (or by ``Reservation/release()``).
    final class Reservation: Sendable {
        private let memory: OfferMemory
        private let bytes = Locked(0)

        fileprivate init(memory: OfferMemory) { self.memory = memory }

        /// Reserves room for `offerBytes` more bytes of the offer, or throws the Decline that
        /// says why it cannot be held: larger than every offer may be here together, or than
        /// what the offers of other connections leave.
        func add(offerBytes: Int) throws(TransferError) {
            let (cost, overflow) = offerBytes.multipliedReportingOverflow(by: OfferMemory.bytesHeldPerOfferByte)
            let own = bytes.withLock { $0 }  // at most the limit
            guard !overflow, cost <= memory.limit - own else {
                throw TransferError(
                    .limitExceeded,
                    "an offer this large needs more memory than this receiver lets offers take (\(TextFormat.bytes(UInt64(memory.limit)))); send fewer files at once")
            }
            let granted = memory.held.withLock { held in
                guard held <= memory.limit - cost else { return false }
                held += cost
                return true
            }
            guard granted else {
                throw TransferError(.busy, "other large offers hold the memory this receiver lets offers take; send again once they are done")
            }
            bytes.withLock { $0 += cost }
        }

        /// Gives the reservation back.
        func release() {
            let mine = bytes.withLock { mine in
                defer { mine = 0 }
                return mine
            }
            memory.held.withLock { $0 -= mine }
        }

        deinit { release() }
    }

    /// A new, empty share for one connection's offer.
    func reservation() -> Reservation { Reservation(memory: self) }

    /// What all offers hold now.
    var heldBytes: Int { held.withLock { $0 } }
}
