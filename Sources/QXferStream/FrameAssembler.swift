import FoundationEssentials
import Glibc

/// The receiver's half of realtime mode, as a value: shards in, whole frames and repair requests
/// out. Time is the sender's clock (the receiver's clock plus the estimated offset), so
/// deadlines compare directly.
///
/// Repair: with parity, a block decodes as soon as any `k` of its shards are in. With NACKs, a
/// data shard is requested as soon as a shard sent after it arrives (the sender sends in order),
/// or ``Configuration/tailTimeout`` after the frame's last arrival when the loss was at its
/// tail; a request unanswered after ``Configuration/retryInterval`` is repeated until the deadline.
/// A frame never seen at all (a gap in indices) is requested whole.
public struct FrameAssembler: Sendable {
    /// Repair and timing settings.
    public struct Configuration: Sendable {
        /// Which repair the sender uses (parity, requests, both, none).
        public var repair: RepairScheme
        /// How long after a frame's last shard a missing tail is requested (ns). Long enough
        /// that a sender briefly held back by congestion control is not taken for a loss.
        public var tailTimeout: UInt64 = 10_000_000
        /// How long to wait for a requested shard before asking again (ns); set it to a bit
        /// more than the round-trip time.
        public var retryInterval: UInt64 = 60_000_000
        /// How long past its deadline an incomplete frame is kept, so a late completion is
        /// counted as late rather than lost (ns).
        public var lateGrace: UInt64 = 2_000_000_000
        /// Frames in reassembly at most; the oldest is given up beyond this (bounded memory).
        public var maximumFramesInProgress = 512
        /// The most bytes the frames in progress may announce together: what a sender can make
        /// the receiver hold (older frames give way).
        public var maximumBytesInProgress = 256 << 20

        public init(repair: RepairScheme) { self.repair = repair }
    }

    /// Something the caller must act on.
    public enum Event: Sendable, Hashable {
        /// A frame is whole; `onTime` if before its deadline.
        case completed(Frame, onTime: Bool)
        /// A frame reached its deadline incomplete (or unseen): playout skips it.
        case expired(UInt64)
    }

    /// The settings in force (the receiver adjusts the retry interval to the measured RTT).
    public var configuration: Configuration
    private var frames: [UInt64: PartialFrame] = [:]
    private var unseen: [UInt64: UnseenFrame] = [:]
    private var finished: Set<UInt64> = []
    private var highestSeen: UInt64?

    /// Counters for the report.
    public private(set) var counters = Counters()
    /// What reassembly has seen.
    public struct Counters: Sendable, Hashable {
        /// Datagrams taken.
        public var datagrams = 0
        /// Shards that were already in, or came after their frame was done or given up.
        public var duplicates = 0
        /// Datagrams that failed to parse or did not match their frame's layout (dropped).
        public var malformed = 0
        /// The sender's warm-up padding (dropped).
        public var padding = 0
        /// Blocks rebuilt from parity.
        public var blocksRecovered = 0
        /// Shards asked for again.
        public var shardsRequested = 0
        /// Shards that arrived as retransmissions.
        public var retransmissionsReceived = 0
    }

    struct PartialFrame {
        var header: ShardHeader
        var layout: ShardLayout
        var blocks: [Block]
        var lastArrival: UInt64
        var expiry: UInt64
        var expiredReported = false
        var requestedAt: [ShardAddress: UInt64] = [:]
        var completeBlocks = 0
    }

    struct Block {
        var dataCount: Int
        var parityCount: Int
        var shards: [Int: Data] = [:]
        var data: [Data]?
        var received: Int { shards.count }
    }

    struct UnseenFrame {
        var expiry: UInt64
        var requestedAt: UInt64?
    }

    public init(configuration: Configuration) { self.configuration = configuration }

    /// Takes one received datagram. Returns what happened and the NACK datagrams to send.
    public mutating func receive(_ datagram: Data, now: UInt64) -> (events: [Event], requests: [Data]) {
        counters.datagrams += 1
        let header: ShardHeader, payload: Data
        switch try? RealtimeDatagram.decode(datagram) {
        case .shard(let shardHeader, let shardPayload)?: (header, payload) = (shardHeader, shardPayload)
        case .padding?:
            counters.padding += 1
            return ([], [])
        case .nack?, nil:
            counters.malformed += 1
            return ([], [])
        }
        if header.isRetransmission { counters.retransmissionsReceived += 1 }
        let index = header.frameIndex
        if finished.contains(index) {
            counters.duplicates += 1
            return ([], [])
        }
        var events: [Event] = []
        var requests: [Data] = []
        if frames[index] == nil {
            let expiry = header.captureTime &+ UInt64(header.deadlineMilliseconds) * 1_000_000
            // Too old to matter (expired and past grace, forgotten already): ignore.
            if now > expiry &+ configuration.lateGrace {
                counters.duplicates += 1
                return ([], [])
            }
            let layout = ShardLayout(frameLength: Int(header.frameLength), shardSize: Int(header.shardSize))
            let blocks = (0..<layout.blockCount).map { Block(dataCount: layout.dataShards(inBlock: $0), parityCount: 0) }
            frames[index] = PartialFrame(header: header, layout: layout, blocks: blocks, lastArrival: now, expiry: expiry)
            unseen[index] = nil
            if !header.isRetransmission {
                if let highest = highestSeen, index > highest, index - highest > 1 {
                    // Frames between were sent before this one and none of their shards came; only
                    // the latest 256 are worth waiting for (a hostile index must not mean a long loop).
                    let skipped = index - highest - 1
                    for missing in (index - min(skipped, 256))..<index where frames[missing] == nil && !finished.contains(missing) {
                        if unseen.count < 256 { unseen[missing] = UnseenFrame(expiry: expiry) }
                    }
                }
            }
            trimFramesInProgress(&events)
        }
        if !header.isRetransmission { highestSeen = max(highestSeen ?? index, index) }
        guard var frame = frames[index] else { return (events, requests) }
        frame.lastArrival = now
        let block = Int(header.address.block), shard = Int(header.address.shard)
        guard frame.blocks[block].dataCount == Int(header.blockDataShards) else {
            counters.malformed += 1
            return (events, requests)
        }
        frame.blocks[block].parityCount = max(frame.blocks[block].parityCount, Int(header.blockParityShards))
        if frame.blocks[block].data != nil || frame.blocks[block].shards[shard] != nil {
            counters.duplicates += 1
            frames[index] = frame
            return (events, requests)
        }
        frame.blocks[block].shards[shard] = payload
        switch complete(&frame.blocks[block], layout: frame.layout, block: block) {
        case .incomplete: break
        case .received: frame.completeBlocks += 1
        case .rebuilt:
            frame.completeBlocks += 1
            counters.blocksRecovered += 1
        }

        if frame.completeBlocks == frame.layout.blockCount {
            frames[index] = nil
            finished.insert(index)
            pruneFinished()
            events.append(.completed(assemble(frame), onTime: now <= frame.expiry))
            if !header.isRetransmission { requests += requestsForEarlierFrames(before: index, now: now) }
            return (events, requests)
        }
        frames[index] = frame
        if configuration.repair.sendsNacks && !header.isRetransmission && now < frame.expiry {
            requests += request(frame: index, upTo: header.address, now: now)
            requests += requestsForEarlierFrames(before: index, now: now)
        }
        return (events, requests)
    }

    /// Advances time: expires frames past their deadline, requests tails and repeats requests.
    public mutating func tick(now: UInt64) -> (events: [Event], requests: [Data]) {
        var events: [Event] = []
        var requests: [Data] = []
        for index in frames.keys.sorted() {
            guard var frame = frames[index] else { continue }
            if now > frame.expiry {
                if !frame.expiredReported {
                    frame.expiredReported = true
                    events.append(.expired(index))
                }
                if now > frame.expiry &+ configuration.lateGrace {
                    frames[index] = nil
                    finished.insert(index)
                    continue
                }
            } else if configuration.repair.sendsNacks, now &- frame.lastArrival >= configuration.tailTimeout {
                frames[index] = frame
                requests += request(frame: index, upTo: nil, now: now)
                continue
            }
            frames[index] = frame
        }
        for index in unseen.keys.sorted() {
            guard var gap = unseen[index] else { continue }
            if now > gap.expiry {
                unseen[index] = nil
                events.append(.expired(index))
                continue
            }
            if configuration.repair.sendsNacks, gap.requestedAt.map({ now &- $0 >= configuration.retryInterval }) ?? true {
                gap.requestedAt = now
                unseen[index] = gap
                counters.shardsRequested += 1
                requests.append(RealtimeDatagram.nack(frame: index, missing: nil).encoded())
            }
        }
        pruneFinished()
        return (events, requests)
    }

    /// Frames still being reassembled (for tests and the report).
    public var framesInProgress: Int { frames.count }

    // MARK: Internals

    enum BlockProgress { case incomplete, received, rebuilt }

    /// Decodes a block once it has enough shards.
    private func complete(_ block: inout Block, layout: ShardLayout, block number: Int) -> BlockProgress {
        guard block.data == nil, block.received >= block.dataCount else { return .incomplete }
        if (0..<block.dataCount).allSatisfy({ block.shards[$0] != nil }) {
            block.data = (0..<block.dataCount).map { block.shards[$0]! }
            block.shards = [:]
            return .received
        }
        do {
            // Parity: pad every shard to the shard size (the frame's last shard is short).
            var padded: [Int: [UInt8]] = [:]
            for (index, bytes) in block.shards {
                var shard = [UInt8](bytes)
                if shard.count < layout.shardSize { shard.append(contentsOf: repeatElement(0, count: layout.shardSize - shard.count)) }
                padded[index] = shard
            }
            guard let data = ReedSolomon.reconstruct(shards: padded, k: block.dataCount, m: block.parityCount) else { return .incomplete }
            block.data = data.enumerated().map { shard, bytes in
                Data(bytes.prefix(layout.dataLength(block: number, shard: shard)))
            }
        }
        block.shards = [:]
        return .rebuilt
    }

    private func assemble(_ frame: PartialFrame) -> Frame {
        var payload = Data(capacity: frame.layout.frameLength)
        for block in frame.blocks { for shard in block.data ?? [] { payload.append(shard) } }
        return Frame(
            index: frame.header.frameIndex, isKeyframe: frame.header.isKeyframe, captureTime: frame.header.captureTime,
            deadline: .milliseconds(Int64(frame.header.deadlineMilliseconds)), payload: payload, timestamp: frame.header.timestamp)
    }

    /// Requests the missing data shards of a frame: those placed before `address` (sent earlier,
    /// so lost) that were never requested, or with `address` nil every missing one not
    /// requested within the retry interval.
    private mutating func request(frame index: UInt64, upTo address: ShardAddress?, now: UInt64) -> [Data] {
        guard var frame = frames[index] else { return [] }
        var missing: [ShardAddress] = []
        for (number, block) in frame.blocks.enumerated() where block.data == nil {
            if let address, Int(address.block) < number { break }
            // With parity on the way, ask only for what parity cannot cover: once the whole
            // block has passed, the shortfall below k.
            var shortfall = block.dataCount - block.received
            if configuration.repair.sendsParity {
                if let address, Int(address.block) == number { continue }
            } else {
                shortfall = Int.max
            }
            for shard in 0..<block.dataCount where block.shards[shard] == nil && shortfall > 0 {
                let candidate = ShardAddress(block: UInt16(number), shard: UInt8(shard))
                if let address, candidate >= address { break }
                if let asked = frame.requestedAt[candidate] {
                    if address != nil || now &- asked < configuration.retryInterval { shortfall -= 1; continue }
                }
                frame.requestedAt[candidate] = now
                missing.append(candidate)
                shortfall -= 1
            }
        }
        frames[index] = frame
        guard !missing.isEmpty else { return [] }
        counters.shardsRequested += missing.count
        return stride(from: 0, to: missing.count, by: 300).map {
            RealtimeDatagram.nack(frame: index, missing: Array(missing[$0..<min($0 + 300, missing.count)])).encoded()
        }
    }

    /// An original shard of a later frame arrived: every earlier incomplete frame lost its tail.
    private mutating func requestsForEarlierFrames(before index: UInt64, now: UInt64) -> [Data] {
        guard configuration.repair.sendsNacks else { return [] }
        var requests: [Data] = []
        for earlier in frames.keys.sorted() where earlier < index {
            guard let frame = frames[earlier], now < frame.expiry else { continue }
            let allRequested = frame.blocks.enumerated().allSatisfy { number, block in
                block.data != nil || (0..<block.dataCount).allSatisfy {
                    block.shards[$0] != nil || frame.requestedAt[ShardAddress(block: UInt16(number), shard: UInt8($0))] != nil
                }
            }
            if !allRequested { requests += request(frame: earlier, upTo: nil, now: now) }
        }
        return requests
    }

    private mutating func trimFramesInProgress(_ events: inout [Event]) {
        var announced = frames.values.reduce(0) { $0 + Int($1.header.frameLength) }
        while frames.count > configuration.maximumFramesInProgress || announced > configuration.maximumBytesInProgress,
              let oldest = frames.keys.min() {
            announced -= Int(frames[oldest]!.header.frameLength)
            frames[oldest] = nil
            finished.insert(oldest)
            events.append(.expired(oldest))
        }
    }

    private mutating func pruneFinished() {
        guard finished.count > 8192, let highest = highestSeen else { return }
        finished = finished.filter { $0 &+ 4096 > highest }
    }
}

/// Puts completed frames back in order for the output file, skipping frames that will not come.
///
/// A frame is written when every earlier frame is written or given up. An earlier frame is given
/// up when the assembler says it expired, or when a later frame waiting behind it reaches its
/// own deadline (an earlier frame's deadline is no later). A frame arriving after its place was
/// given up is dropped from the output (it is still counted, as late).
public struct PlayoutBuffer: Sendable {
    /// One step of the output.
    public enum Item: Sendable, Hashable {
        case frame(Frame)
        /// This frame will not be written.
        case gap(UInt64)
    }

    /// The index the output expects next.
    public private(set) var nextIndex: UInt64 = 0
    private var waiting: [UInt64: Frame] = [:]
    private var givenUp: Set<UInt64> = []

    /// A run of missing frames longer than this is skipped as one gap: a broken or hostile
    /// sender announcing frame 2^63 (or 2^63 frames sent) must not make the receiver write, or
    /// repeat, that many frames. 65 536 frames are 18 minutes at 60 fps.
    public static let longestGap: UInt64 = 1 << 16

    public init() {}

    /// Adds a completed frame; false if its place in the output has passed.
    @discardableResult
    public mutating func add(_ frame: Frame) -> Bool {
        guard frame.index >= nextIndex, waiting.count < 4096 else { return false }
        waiting[frame.index] = frame
        return true
    }

    /// Marks a frame as not coming.
    public mutating func giveUp(_ index: UInt64) {
        if index >= nextIndex && waiting[index] == nil { givenUp.insert(index) }
    }

    /// What can be written now, in order. With `through`, everything before that index is
    /// written or skipped (the end of the stream).
    public mutating func release(now: UInt64, through end: UInt64? = nil) -> [Item] {
        var items: [Item] = []
        while true {
            if let frame = waiting.removeValue(forKey: nextIndex) {
                items.append(.frame(frame))
            } else if givenUp.remove(nextIndex) != nil {
                items.append(.gap(nextIndex))
            } else if let end, nextIndex < end {
                items.append(.gap(nextIndex))
                nextIndex = afterGap(before: end)
                continue
            } else if let overdue = waiting.values.map(\.expiry).min(), overdue <= now {
                items.append(.gap(nextIndex))
                nextIndex = afterGap(before: .max)
                continue
            } else {
                break
            }
            // Index 2^64 - 1 is the last there is: nothing can follow it.
            guard nextIndex < .max else { break }
            nextIndex += 1
        }
        return items
    }

    /// Where the output goes on after a gap at ``nextIndex`` (nothing waits there): the next
    /// index, or past a run longer than ``longestGap`` straight to the first frame waiting (or
    /// `limit`, if sooner).
    private func afterGap(before limit: UInt64) -> UInt64 {
        // Above nextIndex: waiting frames are at or after it, and none is at it.
        let next = min(limit, waiting.keys.min() ?? limit)
        // Checked: both are decoded picture numbers; next > nextIndex holds, but a slip must
        // not wrap round into a gap of 2^64 pictures.
        let (run, below) = next.subtractingReportingOverflow(nextIndex)
        let (following, atEnd) = nextIndex.addingReportingOverflow(1)
        if below || atEnd { return .max }  // cannot happen (see above); never step backwards
        return run > PlayoutBuffer.longestGap ? next : following
    }
}
