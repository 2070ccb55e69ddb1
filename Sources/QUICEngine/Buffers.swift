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
struct ByteQueue {
    private var storage: [UInt8] = []
    private var head = 0

    var count: Int { storage.count - head }
    var isEmpty: Bool { count == 0 }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        if head > 0 && head >= storage.count / 2 {
            storage.removeFirst(head)
            head = 0
        }
        storage.append(contentsOf: bytes)
    }

    /// Moves as many bytes as fit into `buffer`; returns how many.
    mutating func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        let n = Swift.min(buffer.count, count)
        guard n > 0 else { return 0 }
        storage.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[head..<head + n])) }
        head += n
        if head == storage.count {
            storage.removeAll(keepingCapacity: storage.capacity <= 1 << 16)
            head = 0
        }
        return n
    }

    mutating func removeAll() {
        storage = []
        head = 0
    }
}
