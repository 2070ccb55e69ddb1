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

    /// One connection's share: what it holds, and once its offer is accepted, how to tell
    /// whether its sender keeps the pace and how to cut it off.
    private struct Share {
        var bytes = 0
        var shortfall: (@Sendable () -> UInt64?)?
        var evict: (@Sendable () -> Void)?
    }
    private struct State {
        var held = 0
        var shares: [Int: Share] = [:]
        var next = 0
    }
    private let state = Locked(State())

    /// A quarter of the memory this process can have (``UsableMemory``), at least 256 MiB and
    /// at most 4 GiB: the largest Offer qxfer/1 allows (256 MiB) fits alone on a machine of 16 GiB.
    static var defaultLimit: Int { UsableMemory.share(1, of: 4, atLeast: 256 << 20, atMost: 4 << 30) }

    init(limit: Int = OfferMemory.defaultLimit) { self.limit = limit }

    /// One offer's share, released when the value goes (or by ``Reservation/release()``).
    final class Reservation: Sendable {
        private let memory: OfferMemory
        private let id: Int

        fileprivate init(memory: OfferMemory, id: Int) {
            self.memory = memory
            self.id = id
        }

        /// Reserves room for `offerBytes` more bytes of the offer, or throws the Decline that
        /// says why it cannot be held: larger than every offer may be here together, or than
        /// what the offers of other connections leave once the accepted transfers that fall
        /// behind the minimum rate are cut off (``yieldable(shortfall:evict:)``).
        func add(offerBytes: Int) throws(TransferError) {
            let (cost, overflow) = offerBytes.multipliedReportingOverflow(by: OfferMemory.bytesHeldPerOfferByte)
            let limit = memory.limit
            let (outcome, evicted) = memory.state.withLock { state -> (TransferError.Code?, [@Sendable () -> Void]) in
                let own = state.shares[id]?.bytes ?? 0  // at most the limit
                guard !overflow, cost <= limit - own else { return (.limitExceeded, []) }
                var evicted: [@Sendable () -> Void] = []
                if state.held > limit - cost {
                    // The transfers furthest behind first, only as many as make room, and
                    // none if even all of them would not.
                    let behind = state.shares.compactMap { key, share -> (key: Int, shortfall: UInt64)? in
                        guard key != id, share.bytes > 0, let shortfall = share.shortfall?() else { return nil }
                        return (key, shortfall)
                    }.sorted { $0.shortfall > $1.shortfall }
                    var freed = 0
                    var taken: [Int] = []
                    for candidate in behind where state.held - freed > limit - cost {
                        freed += state.shares[candidate.key]!.bytes
                        taken.append(candidate.key)
                    }
                    guard state.held - freed <= limit - cost else { return (.busy, []) }
                    for key in taken {
                        // Counted free at once: the transfer ends within moments, and its
                        // own release then gives back nothing more.
                        state.held -= state.shares[key]!.bytes
                        state.shares[key]!.bytes = 0
                        state.shares[key]!.shortfall = nil
                        if let evict = state.shares[key]!.evict { evicted.append(evict) }
                    }
                }
                state.held += cost
                state.shares[id, default: Share()].bytes += cost
                return (nil, evicted)
            }
            for evict in evicted { evict() }
            switch outcome {
            case nil:
                return
            case .limitExceeded?:
                throw TransferError(
                    .limitExceeded,
                    "an offer this large needs more memory than this receiver lets offers take (\(TextFormat.bytes(UInt64(limit)))); send fewer files at once")
            default:
                throw TransferError(.busy, "other large offers hold the memory this receiver lets offers take; send again once they are done")
            }
        }

        /// The offer is accepted: from now on, when another connection's offer does not fit,
        /// this transfer is cut off (`evict` is called, once) and its share taken back if
        /// `shortfall` says how far behind the minimum rate its sender is (nil: it keeps up).
        func yieldable(shortfall: @escaping @Sendable () -> UInt64?, evict: @escaping @Sendable () -> Void) {
            memory.state.withLock {
                $0.shares[id, default: Share()].shortfall = shortfall
                $0.shares[id, default: Share()].evict = evict
            }
        }

        /// Gives the reservation back.
        func release() {
            memory.state.withLock { state in
                guard let share = state.shares.removeValue(forKey: id) else { return }
                state.held -= share.bytes
            }
        }

        deinit { release() }
    }

    /// A new, empty share for one connection's offer.
    func reservation() -> Reservation {
        Reservation(memory: self, id: state.withLock { state in
            state.next += 1
            return state.next
        })
    }

    /// What all offers hold now.
    var heldBytes: Int { state.withLock { $0.held } }
}
