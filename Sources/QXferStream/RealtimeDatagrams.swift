import FoundationEssentials
import Glibc

/// One datagram of realtime mode: a shard of a frame, or a request for missing shards.
///
/// Shard, on the wire (big-endian): type 0x10, frame index u64, capture time u64, timestamp u64, deadline ms
/// u32, frame length u32, flags u8 (1 keyframe, 2 retransmission), shard size u16, block u16,
/// block count u16, shard index in block u8, data shards in block u8, parity shards in block u8,
/// then the shard's bytes (the last data shard of a frame may be shorter than the shard size).
/// NACK: type 0x11, frame index u64, count u16 (0xFFFF: the whole frame), count × (block u16,
/// shard u8). Padding: type 0x12, then zero bytes (the sender's warm-up before the first frame).
public enum RealtimeDatagram: Sendable, Hashable {
    case shard(ShardHeader, Data)
    case nack(frame: UInt64, missing: [ShardAddress]?)
    /// Carries nothing: sent to open the congestion window before the first frame.
    case padding(byteCount: Int)

    static let shardType: UInt8 = 0x10
    static let nackType: UInt8 = 0x11
    static let paddingType: UInt8 = 0x12
    /// Bytes before a shard's payload.
    public static let shardHeaderSize = 43

    /// The datagram as bytes.
    public func encoded() -> Data {
        var writer = ByteWriter(capacity: 64)
        switch self {
        case .shard(let header, let payload):
            writer.write(Self.shardType)
            writer.write(header.frameIndex)
            writer.write(header.captureTime)
            writer.write(header.timestamp)
            writer.write(header.deadlineMilliseconds)
            writer.write(header.frameLength)
            writer.write(UInt8((header.isKeyframe ? 1 : 0) | (header.isRetransmission ? 2 : 0)))
            writer.write(header.shardSize)
            writer.write(header.address.block)
            writer.write(header.blockCount)
            writer.write(header.address.shard)
            writer.write(header.blockDataShards)
            writer.write(header.blockParityShards)
            writer.write(payload)
        case .nack(let frame, let missing):
            writer.write(Self.nackType)
            writer.write(frame)
            if let missing {
                writer.write(UInt16(missing.count))
                for address in missing {
                    writer.write(address.block)
                    writer.write(address.shard)
                }
            } else {
                writer.write(UInt16.max)
            }
        case .padding(let byteCount):
            writer.write(Self.paddingType)
            writer.write(Data(count: max(0, byteCount - 1)))
        }
        return writer.data
    }

    /// Parses a received datagram; throws on anything malformed (the caller drops it).
    public static func decode(_ data: Data) throws -> RealtimeDatagram {
        var reader = ByteReader(data)
        switch try reader.read(UInt8.self, "datagram type") {
        case shardType:
            let frame = try reader.read(UInt64.self, "shard")
            let capture = try reader.read(UInt64.self, "shard")
            let timestamp = try reader.read(UInt64.self, "shard")
            let deadline = try reader.read(UInt32.self, "shard")
            let length = try reader.read(UInt32.self, "shard")
            let flags = try reader.read(UInt8.self, "shard")
            guard flags & ~3 == 0 else { throw StreamError(.malformed, "shard flags \(flags) set unknown bits") }
            let shardSize = try reader.read(UInt16.self, "shard")
            let block = try reader.read(UInt16.self, "shard")
            let blockCount = try reader.read(UInt16.self, "shard")
            let shard = try reader.read(UInt8.self, "shard")
            let dataShards = try reader.read(UInt8.self, "shard")
            let parityShards = try reader.read(UInt8.self, "shard")
            let header = ShardHeader(
                frameIndex: frame, captureTime: capture, timestamp: timestamp, deadlineMilliseconds: deadline, frameLength: length,
                isKeyframe: flags & 1 != 0, isRetransmission: flags & 2 != 0, shardSize: shardSize,
                address: ShardAddress(block: block, shard: shard), blockCount: blockCount,
                blockDataShards: dataShards, blockParityShards: parityShards)
            let payload = reader.readRest()
            try header.validate(payloadCount: payload.count)
            return .shard(header, Data(payload))
        case nackType:
            let frame = try reader.read(UInt64.self, "nack")
            let count = try reader.read(UInt16.self, "nack")
            var missing: [ShardAddress]?
            if count != UInt16.max {
                missing = try (0..<count).map { _ in
                    ShardAddress(block: try reader.read(UInt16.self, "nack"), shard: try reader.read(UInt8.self, "nack"))
                }
            }
            guard reader.remaining == 0 else { throw StreamError(.malformed, "\(reader.remaining) stray bytes after a NACK") }
            return .nack(frame: frame, missing: missing)
        case paddingType:
            guard reader.readRest().allSatisfy({ $0 == 0 }) else { throw StreamError(.malformed, "padding carries data") }
            return .padding(byteCount: data.count)
        case let other:
            throw StreamError(.malformed, "unknown datagram type \(other)")
        }
    }
}

/// Where a shard sits in its frame.
public struct ShardAddress: Sendable, Hashable, Comparable {
    /// The Reed–Solomon block.
    public var block: UInt16
    /// The shard within the block: data shards first, then parity.
    public var shard: UInt8

    public init(block: UInt16, shard: UInt8) {
        self.block = block
        self.shard = shard
    }

    public static func < (lhs: ShardAddress, rhs: ShardAddress) -> Bool {
        (lhs.block, lhs.shard) < (rhs.block, rhs.shard)
    }
}

/// What every shard says about its frame, so any one shard starts reassembly.
public struct ShardHeader: Sendable, Hashable {
    /// The frame's index, capture time (sender's clock, ns) and pts.
    public var frameIndex: UInt64
    public var captureTime: UInt64
    public var timestamp: UInt64
    /// The frame's deadline after capture, its length, and whether it is a keyframe.
    public var deadlineMilliseconds: UInt32
    public var frameLength: UInt32
    public var isKeyframe: Bool
    /// Whether this shard is resent on request (not used to detect gaps).
    public var isRetransmission: Bool
    /// The frame's shard size, this shard's place, and its block's layout.
    public var shardSize: UInt16
    public var address: ShardAddress
    public var blockCount: UInt16
    public var blockDataShards: UInt8
    public var blockParityShards: UInt8

    /// Shards of at least this size (or the whole frame) keep the receiver's bookkeeping per
    /// announced byte small, whatever a sender claims. QUIC datagrams hold 1,100 bytes or more.
    static let minimumShardSize = 256

    /// Checks the header against the frame layout it implies, so a hostile datagram cannot make
    /// the receiver index out of range or allocate without bound.
    func validate(payloadCount: Int) throws {
        guard shardSize > 0, shardSize >= min(frameLength, UInt32(Self.minimumShardSize)), frameLength <= UInt32(ControlMessage.maximumBodySize) else {
            throw StreamError(.malformed, "shard header: size \(shardSize), frame length \(frameLength)")
        }
        let layout = ShardLayout(frameLength: Int(frameLength), shardSize: Int(shardSize))
        guard Int(blockCount) == layout.blockCount, Int(address.block) < layout.blockCount,
              Int(blockDataShards) == layout.dataShards(inBlock: Int(address.block)),
              Int(address.shard) < Int(blockDataShards) + Int(blockParityShards),
              Int(blockDataShards) + Int(blockParityShards) <= ReedSolomon.maximumShards else {
            throw StreamError(.malformed, "shard header does not match its frame layout")
        }
        let expected = Int(address.shard) < Int(blockDataShards)
            ? layout.dataLength(block: Int(address.block), shard: Int(address.shard)) : Int(shardSize)
        guard payloadCount == expected else {
            throw StreamError(.malformed, "shard carries \(payloadCount) bytes, its place holds \(expected)")
        }
    }
}

/// How a frame is cut into shards and blocks; the sender and the receiver compute the same one.
///
/// `K = ⌈length / size⌉` data shards (at least one), in `B = ⌈K / 32⌉` blocks of near-equal size
/// (the first `K mod B` blocks hold one more). Every shard holds `size` bytes except the very
/// last, which holds what remains; for parity it counts as zero-padded.
public struct ShardLayout: Sendable, Hashable {
    /// The most data shards in one Reed–Solomon block: bounds the decoding work and keeps
    /// small blocks, whose parity then covers fewer shards.
    public static let maximumBlockDataShards = 32

    /// The frame's length, the shard size, and the resulting shard and block counts.
    public let frameLength: Int
    public let shardSize: Int
    public let dataShards: Int
    public let blockCount: Int

    public init(frameLength: Int, shardSize: Int) {
        precondition(shardSize > 0)
        self.frameLength = frameLength
        self.shardSize = shardSize
        dataShards = max(1, (frameLength + shardSize - 1) / shardSize)
        blockCount = (dataShards + Self.maximumBlockDataShards - 1) / Self.maximumBlockDataShards
    }

    /// The number of data shards in a block.
    public func dataShards(inBlock block: Int) -> Int {
        dataShards / blockCount + (block < dataShards % blockCount ? 1 : 0)
    }

    /// The frame-wide index of a block's first data shard.
    public func firstShard(ofBlock block: Int) -> Int {
        let base = dataShards / blockCount, extra = dataShards % blockCount
        return block * base + min(block, extra)
    }

    /// The byte range of a data shard within the frame.
    public func dataRange(block: Int, shard: Int) -> Range<Int> {
        let start = (firstShard(ofBlock: block) + shard) * shardSize
        return min(start, frameLength)..<min(start + shardSize, frameLength)
    }

    func dataLength(block: Int, shard: Int) -> Int { dataRange(block: block, shard: shard).count }
}

/// How many parity shards a block of `k` data shards gets under FEC: 1 + ⌈k / 8⌉ (2 for a
/// 4-shard block, 3 for 12, 5 for 32), about 20–30 % overhead.
///
/// Chosen for 1 % independent loss: a 14-shard frame with 3 parity shards is lost only if 4 of
/// its 17 datagrams are, about 2·10⁻⁵, well below the 10⁻³ a 99.9 % delivery target allows.
public func parityShards(forDataShards k: Int) -> Int { 1 + (k + 7) / 8 }

/// The sender's half of realtime mode, as a value: frames in, datagrams out; NACKs in,
/// retransmissions out. Keeps each frame's data shards until its deadline passes.
public struct RealtimeSender: Sendable {
    /// The repair scheme: parity shards are added for FEC; frames are kept for NACKs.
    public let repair: RepairScheme
    private var recent: [UInt64: SentFrame] = [:]
    /// Datagrams resent on request, for the report.
    public private(set) var retransmitted = 0
    /// Requests that came too late (frame expired or unknown).
    public private(set) var refusedRequests = 0

    struct SentFrame {
        var header: ShardHeader
        var layout: ShardLayout
        var payload: Data
        var expiry: UInt64
    }

    public init(repair: RepairScheme) { self.repair = repair }

    /// The datagrams carrying `frame`, data shards then parity, each at most `maximumDatagramSize`.
    public mutating func datagrams(for frame: Frame, maximumDatagramSize: Int, now: UInt64) -> [Data] {
        let shardSize = max(1, min(Int(UInt16.max), maximumDatagramSize - RealtimeDatagram.shardHeaderSize))
        let layout = ShardLayout(frameLength: frame.payload.count, shardSize: shardSize)
        var header = ShardHeader(
            frameIndex: frame.index, captureTime: frame.captureTime, timestamp: frame.timestamp, deadlineMilliseconds: frame.deadlineMilliseconds,
            frameLength: UInt32(frame.payload.count), isKeyframe: frame.isKeyframe, isRetransmission: false,
            shardSize: UInt16(shardSize), address: ShardAddress(block: 0, shard: 0), blockCount: UInt16(layout.blockCount),
            blockDataShards: 0, blockParityShards: 0)
        let payload = frame.payload
        let base = payload.startIndex
        var output: [Data] = []
        for block in 0..<layout.blockCount {
            let k = layout.dataShards(inBlock: block)
            let m = repair.sendsParity ? parityShards(forDataShards: k) : 0
            header.blockDataShards = UInt8(k)
            header.blockParityShards = UInt8(m)
            var shards: [[UInt8]] = []
            for shard in 0..<k {
                let range = layout.dataRange(block: block, shard: shard)
                let bytes = payload[(base + range.lowerBound)..<(base + range.upperBound)]
                header.address = ShardAddress(block: UInt16(block), shard: UInt8(shard))
                output.append(RealtimeDatagram.shard(header, Data(bytes)).encoded())
                if m > 0 {
                    var padded = [UInt8](bytes)
                    padded.append(contentsOf: repeatElement(0, count: shardSize - padded.count))
                    shards.append(padded)
                }
            }
            for (j, parity) in (m > 0 ? ReedSolomon.parity(data: shards, parityCount: m) : []).enumerated() {
                header.address = ShardAddress(block: UInt16(block), shard: UInt8(k + j))
                output.append(RealtimeDatagram.shard(header, Data(parity)).encoded())
            }
        }
        if repair.sendsNacks {
            header.address = ShardAddress(block: 0, shard: 0)
            recent[frame.index] = SentFrame(header: header, layout: layout, payload: payload, expiry: frame.expiry)
        }
        forgetExpired(now: now)
        return output
    }

    /// The datagrams to resend for a request, if the frame is still within its deadline.
    public mutating func handle(nackFor frameIndex: UInt64, missing: [ShardAddress]?, now: UInt64) -> [Data] {
        forgetExpired(now: now)
        guard let sent = recent[frameIndex], now < sent.expiry else {
            refusedRequests += 1
            return []
        }
        let layout = sent.layout
        let wanted: [ShardAddress] = missing ?? (0..<layout.blockCount).flatMap { block in
            (0..<layout.dataShards(inBlock: block)).map { ShardAddress(block: UInt16(block), shard: UInt8($0)) }
        }
        var header = sent.header
        header.isRetransmission = true
        var output: [Data] = []
        let base = sent.payload.startIndex
        for address in wanted.prefix(1024) {
            let block = Int(address.block), shard = Int(address.shard)
            guard block < layout.blockCount, shard < layout.dataShards(inBlock: block) else { continue }
            let k = layout.dataShards(inBlock: block)
            header.address = address
            header.blockDataShards = UInt8(k)
            header.blockParityShards = UInt8(repair.sendsParity ? parityShards(forDataShards: k) : 0)
            let range = layout.dataRange(block: block, shard: shard)
            output.append(RealtimeDatagram.shard(header, Data(sent.payload[(base + range.lowerBound)..<(base + range.upperBound)])).encoded())
        }
        retransmitted += output.count
        return output
    }

    private mutating func forgetExpired(now: UInt64) {
        if recent.count > 8, recent.values.contains(where: { $0.expiry <= now }) {
            recent = recent.filter { $0.value.expiry > now }
        }
    }
}
