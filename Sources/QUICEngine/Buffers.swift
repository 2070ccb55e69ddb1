internal import CNGTCP2

/// Bytes written to a stream and kept until the peer acknowledges them.
///
/// ngtcp2 does not copy stream data: the pointers given to
/// `ngtcp2_conn_writev_stream` must stay valid until `acked_stream_data_offset`
/// covers them (it reports a contiguous acknowledged prefix). So writes are copied into
/// blocks of one fixed size whose addresses never move, filled one after another (block `k`
/// holds stream offsets `k * blockSize ..< (k + 1) * blockSize`), and a block is freed once
/// wholly acknowledged. One size for every block keeps the allocator from fragmenting: chunks
/// sized like each write (up to a MiB, in every size a partial write leaves) left the sender's
/// heap holding about 10 MiB more than it used on a lossy path (docs/benchmarks.md, "Resident
/// memory"). Not thread-safe; owned by one ``QUICConnection``.
final class StreamSendBuffer {
    static let blockSize = SendBlockPool.blockSize

    private let pool: SendBlockPool
    /// Blocks from `blocks[firstBlock]`, which holds block number `firstBlockNumber`.
    private var blocks: [UnsafeMutableRawPointer] = []
    private var firstBlock = 0
    private var firstBlockNumber: UInt64 = 0

    /// Everything below this offset is acknowledged.
    private(set) var ackedOffset: UInt64 = 0
    /// Everything below this offset has been given to ngtcp2.
    private(set) var sentOffset: UInt64 = 0
    /// Offset after the last written byte.
    private(set) var endOffset: UInt64 = 0

    /// Bytes held (written, not yet acknowledged).
    var bufferedBytes: Int { Int(endOffset - ackedOffset) }
    /// Bytes written but not yet given to ngtcp2.
    var unsentBytes: Int { Int(endOffset - sentOffset) }
    /// Memory the blocks of this buffer take.
    var heldBlockBytes: Int { (blocks.count - firstBlock) * Self.blockSize }

    init(pool: SendBlockPool) {
        self.pool = pool
    }

    deinit {
        for i in firstBlock..<blocks.count { pool.release(blocks[i]) }
    }

    /// The block holding `offset` and the position of `offset` in it; `offset` must be held.
    private func location(of offset: UInt64) -> (block: UnsafeMutableRawPointer, position: Int) {
        let number = offset / UInt64(Self.blockSize)
        return (blocks[firstBlock + Int(number - firstBlockNumber)], Int(offset % UInt64(Self.blockSize)))
    }

    /// Copies up to `limit - bufferedBytes` bytes of `bytes`; returns how many were taken.
    func append(_ bytes: UnsafeRawBufferPointer, limit: Int) -> Int {
        let room = max(0, limit - bufferedBytes)
        let total = min(room, bytes.count)
        var copied = 0
        while copied < total {
            let position = Int(endOffset % UInt64(Self.blockSize))
            if position == 0 {
                if firstBlock == blocks.count { firstBlockNumber = endOffset / UInt64(Self.blockSize) }
                blocks.append(pool.take())
            }
            let n = min(total - copied, Self.blockSize - position)
            (blocks[blocks.count - 1] + position).copyMemory(from: bytes.baseAddress! + copied, byteCount: n)
            copied += n
            endOffset += UInt64(n)
        }
        return total
    }

    /// Fills `vecs` with the unsent bytes, at most `vecs.count` entries; returns how many were filled.
    func unsentVectors(into vecs: UnsafeMutableBufferPointer<ngtcp2_vec>) -> Int {
        var count = 0
        var offset = sentOffset
        while count < vecs.count && offset < endOffset {
            let (block, position) = location(of: offset)
            let length = Int(min(endOffset - offset, UInt64(Self.blockSize - position)))
            vecs[count] = ngtcp2_vec(base: (block + position).assumingMemoryBound(to: UInt8.self), len: length)
            count += 1
            offset += UInt64(length)
        }
        return count
    }

    /// Records that ngtcp2 took `count` more bytes.
    func markSent(_ count: Int) {
        sentOffset = min(endOffset, sentOffset + UInt64(count))
    }

    /// Marks every byte unsent again, for a stream whose early data the server refused; false
    /// if some were acknowledged (then the stream cannot start over at offset 0).
    func rewind() -> Bool {
        guard ackedOffset == 0 else { return false }
        sentOffset = 0
        return true
    }

    /// Frees blocks wholly below `offset` (from `acked_stream_data_offset`); returns the bytes released.
    @discardableResult
    func acknowledge(upTo offset: UInt64) -> Int {
        let clamped = min(offset, sentOffset)
        guard clamped > ackedOffset else { return 0 }
        let released = Int(clamped - ackedOffset)
        ackedOffset = clamped
        let wholeBlocks = ackedOffset / UInt64(Self.blockSize)
        while firstBlock < blocks.count && firstBlockNumber < wholeBlocks {
            pool.release(blocks[firstBlock])
            firstBlock += 1
            firstBlockNumber += 1
        }
        if firstBlock == blocks.count || firstBlock > 64 && firstBlock * 2 > blocks.count {
            blocks.removeFirst(firstBlock)
            firstBlock = 0
        }
        return released
    }
}

/// The blocks of one connection's ``StreamSendBuffer``s: freed blocks are kept (up to a
/// bound) for the next writes of any stream, so a steady transfer does not call the allocator
/// and many short streams do not each allocate their own.
final class SendBlockPool {
    /// Small enough that a stream holding one short message costs little, large enough that a
    /// packet rarely spans two blocks.
    static let blockSize = 16 << 10
    static let spareLimit = 64

    private var spare: [UnsafeMutableRawPointer] = []
    /// Blocks taken and not yet released: what all the connection's send buffers hold.
    private(set) var blocksInUse = 0

    /// Memory the connection's send buffers hold together.
    var bytesInUse: Int { blocksInUse * Self.blockSize }

    deinit {
        for block in spare { block.deallocate() }
    }

    func take() -> UnsafeMutableRawPointer {
        blocksInUse += 1
        return spare.popLast() ?? .allocate(byteCount: Self.blockSize, alignment: 16)
    }

    func release(_ block: UnsafeMutableRawPointer) {
        blocksInUse -= 1
        if spare.count < Self.spareLimit { spare.append(block) } else { block.deallocate() }
    }
}

/// Received stream bytes waiting for the application, in order.
///
/// Kept in chunks of a fixed size rather than one growing array: when a repaired loss releases
/// a window's worth of bytes at once, an array doubled its capacity and copied itself on the
/// way (twice the window resident for a moment), and dropping what was read moved the rest.
/// Chunks cost what they hold, rounded up to one chunk, and reading frees them.
struct ByteQueue {
    static let chunkSize = 64 << 10

    private var chunks: [[UInt8]] = []
    /// Index of the first chunk still holding unread bytes.
    private var firstChunk = 0
    /// Bytes already read from `chunks[firstChunk]`.
    private var headOffset = 0
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        var rest = bytes[...]
        while !rest.isEmpty {
            if chunks.count == firstChunk || chunks[chunks.count - 1].count == Self.chunkSize {
                var chunk: [UInt8] = []
                chunk.reserveCapacity(Self.chunkSize)
                chunks.append(chunk)
            }
            let last = chunks.count - 1
            let n = Swift.min(rest.count, Self.chunkSize - chunks[last].count)
            chunks[last].append(contentsOf: UnsafeRawBufferPointer(rebasing: rest.prefix(n)))
            rest = rest.dropFirst(n)
            count += n
        }
    }

    /// Moves as many bytes as fit into `buffer`; returns how many.
    mutating func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        var copied = 0
        while copied < buffer.count && firstChunk < chunks.count {
            let n = chunks[firstChunk].withUnsafeBytes { chunk in
                let n = Swift.min(buffer.count - copied, chunk.count - headOffset)
                UnsafeMutableRawBufferPointer(rebasing: buffer[copied..<copied + n])
                    .copyMemory(from: UnsafeRawBufferPointer(rebasing: chunk[headOffset..<headOffset + n]))
                return n
            }
            copied += n
            headOffset += n
            if headOffset == chunks[firstChunk].count && (headOffset == Self.chunkSize || firstChunk < chunks.count - 1) {
                chunks[firstChunk] = []
                firstChunk += 1
                headOffset = 0
            } else if headOffset == chunks[firstChunk].count {
                break  // the last, partly filled chunk is empty now: keep it for the next append
            }
        }
        count -= copied
        if firstChunk == chunks.count || firstChunk >= 64 && firstChunk >= chunks.count / 2 {
            chunks.removeFirst(firstChunk)
            firstChunk = 0
        }
        return copied
    }

    mutating func removeAll() {
        chunks = []
        firstChunk = 0
        headOffset = 0
        count = 0
    }
}
