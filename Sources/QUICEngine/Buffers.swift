internal import CNGTCP2

/// Bytes written to a stream and kept until the peer acknowledges them.
///
/// ngtcp2 does not copy stream data: the pointers given to
/// `ngtcp2_conn_writev_stream` must stay valid until `acked_stream_data_offset`
/// covers them (it reports a contiguous acknowledged prefix). So each write is
/// copied into its own heap chunk whose address never moves, and chunks are freed
/// once wholly acknowledged. Not thread-safe; owned by one ``QUICConnection``.
final class StreamSendBuffer {
    private struct Chunk {
        let storage: UnsafeMutableRawBufferPointer
        /// Stream offset of the chunk's first byte.
        let offset: UInt64
        var end: UInt64 { offset + UInt64(storage.count) }
    }

    private var chunks: [Chunk] = []
    private var firstChunk = 0
    /// Everything below this offset is acknowledged and freed.
    private(set) var ackedOffset: UInt64 = 0
    /// Everything below this offset has been given to ngtcp2.
    private(set) var sentOffset: UInt64 = 0
    /// Offset after the last written byte.
    private(set) var endOffset: UInt64 = 0
    /// Index of the chunk containing `sentOffset` (or `chunks.count`).
    private var sendChunk = 0

    /// Bytes held (written, not yet acknowledged).
    var bufferedBytes: Int { Int(endOffset - ackedOffset) }
    /// Bytes written but not yet given to ngtcp2.
    var unsentBytes: Int { Int(endOffset - sentOffset) }

    deinit {
        for i in firstChunk..<chunks.count { chunks[i].storage.deallocate() }
    }

    /// Copies up to `limit - bufferedBytes` bytes of `bytes`; returns how many were taken.
    func append(_ bytes: UnsafeRawBufferPointer, limit: Int) -> Int {
        let room = max(0, limit - bufferedBytes)
        let n = min(room, bytes.count)
        guard n > 0 else { return 0 }
        let storage = UnsafeMutableRawBufferPointer.allocate(byteCount: n, alignment: 1)
        storage.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[..<n]))
        chunks.append(Chunk(storage: storage, offset: endOffset))
        endOffset += UInt64(n)
        return n
    }

    /// Fills `vecs` with the unsent bytes, at most `vecs.count` entries; returns how many were filled.
    func unsentVectors(into vecs: UnsafeMutableBufferPointer<ngtcp2_vec>) -> Int {
        var count = 0
        var index = sendChunk
        var offset = sentOffset
        while count < vecs.count && index < chunks.count {
            let chunk = chunks[index]
            let skip = Int(offset - chunk.offset)
            let length = chunk.storage.count - skip
            if length > 0 {
                vecs[count] = ngtcp2_vec(base: chunk.storage.baseAddress!.advanced(by: skip)
                    .assumingMemoryBound(to: UInt8.self), len: length)
                count += 1
            }
            offset = chunk.end
            index += 1
        }
        return count
    }

    /// Records that ngtcp2 took `count` more bytes.
    func markSent(_ count: Int) {
        sentOffset = min(endOffset, sentOffset + UInt64(count))
        while sendChunk < chunks.count && chunks[sendChunk].end <= sentOffset { sendChunk += 1 }
    }

    /// Marks every byte unsent again, for a stream whose early data the server refused; false
    /// if some were acknowledged (then the stream cannot start over at offset 0).
    func rewind() -> Bool {
        guard ackedOffset == 0 else { return false }
        sentOffset = 0
        sendChunk = firstChunk
        return true
    }

    /// Frees chunks wholly below `offset` (from `acked_stream_data_offset`); returns the bytes released.
    @discardableResult
    func acknowledge(upTo offset: UInt64) -> Int {
        guard offset > ackedOffset else { return 0 }
        let clamped = min(offset, endOffset)
        let released = Int(clamped - ackedOffset)
        ackedOffset = clamped
        while firstChunk < chunks.count && chunks[firstChunk].end <= ackedOffset && firstChunk < sendChunk {
            chunks[firstChunk].storage.deallocate()
            firstChunk += 1
        }
        if firstChunk > 64 && firstChunk * 2 > chunks.count {
            chunks.removeFirst(firstChunk)
            sendChunk -= firstChunk
            firstChunk = 0
        }
        return released
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
