import NIOCore

/// Datagrams gathered between two flushes into as few sends as the kernel allows. Consecutive
/// datagrams for one target, all of one size but a shorter last one, make one segmented send
/// (UDP GSO: one system call and one pass through the stack for up to 64 datagrams, where each
/// datagram on its own cost the agent most of its time). They are copied into one buffer per
/// flush (the copy prepends the peer header, or packs a batch's payloads together), so the
/// socket's read buffer goes back to NIO at once; the sends are slices of it.
struct DatagramBatches<Target: Equatable> {
    /// One send: `segments` datagrams of `segmentSize` bytes (the last may be shorter).
    struct Batch {
        var target: Target
        var start: Int
        var length: Int
        var segmentSize: Int
        var segments: Int
        /// A shorter datagram ended it.
        var closed: Bool
    }

    /// Linux's most segments in one send.
    static var maximumSegments: Int { 64 }
    /// The most bytes in one send (an IPv4 datagram's 65 507, less room for headers).
    static var maximumLength: Int { 65_000 }
    /// The buffer each flush's datagrams are copied into (more when a datagram needs it).
    static var bufferCapacity: Int { 256 << 10 }

    private var buffer = ByteBuffer()
    private var batches: [Batch] = []
    /// Whether batches of several datagrams are made; off, each datagram is a send of its own.
    let segmenting: Bool

    init(segmenting: Bool = true) {
        self.segmenting = segmenting
    }

    var isEmpty: Bool { batches.isEmpty }
    var count: Int { batches.count }

    /// Adds one datagram for `target`: `header` (the peer header, or nil) then `payload`.
    /// Returns false, adding nothing, when the buffer has no room left: drain, then add again.
    mutating func append(to target: Target, header: (service: UInt8, flow: UInt16)?, payload: ByteBuffer, allocator: ByteBufferAllocator) -> Bool {
        let size = (header == nil ? 0 : PeerDatagram.dataHeaderSize) + payload.readableBytes
        if buffer.writableBytes < size {
            guard batches.isEmpty else { return false }
            // The last flush's slices may still share the old buffer: a new one, never a write
            // into it (which would copy it whole).
            buffer = allocator.buffer(capacity: max(Self.bufferCapacity, size))
        }
        let start = buffer.writerIndex
        if let header {
            buffer.writeInteger(RelayDatagram.dataType)
            buffer.writeInteger(header.service)
            buffer.writeInteger(header.flow)
        }
        buffer.writeImmutableBuffer(payload)
        if segmenting, let last = batches.last, !last.closed, last.target == target, size <= last.segmentSize,
           last.segments < Self.maximumSegments, last.length + size <= Self.maximumLength {
            batches[batches.count - 1].length += size
            batches[batches.count - 1].segments += 1
            batches[batches.count - 1].closed = size < last.segmentSize
        } else {
            batches.append(Batch(target: target, start: start, length: size, segmentSize: size, segments: 1, closed: false))
        }
        return true
    }

    /// Hands each batch to `send` (its target, its bytes, and its segment size when it holds
    /// several datagrams) and empties the list.
    mutating func drain(_ send: (Target, ByteBuffer, Int?) -> Void) {
        guard !batches.isEmpty else { return }
        for batch in batches {
            guard let slice = buffer.getSlice(at: batch.start, length: batch.length) else { continue }
            send(batch.target, slice, batch.segments > 1 ? batch.segmentSize : nil)
        }
        batches.removeAll(keepingCapacity: true)
        buffer = ByteBuffer()
    }

    /// Calls `body` with each datagram of a received buffer: several when the kernel coalesced
    /// them (GRO, `segmentSize` each), one otherwise.
    static func forEachDatagram(in data: ByteBuffer, segmentSize: Int?, _ body: (ByteBuffer) -> Void) {
        let total = data.readableBytes
        guard let segmentSize, segmentSize > 0, segmentSize < total else { return body(data) }
        var offset = 0
        while offset < total {
            let length = min(segmentSize, total - offset)
            if let segment = data.getSlice(at: data.readerIndex + offset, length: length) { body(segment) }
            offset += length
        }
    }
}
