import NIOCore

extension CircularBuffer where Element == ByteBuffer {
    /// Bytes of a buffer of the queue's own, for the small slices it copies (a larger slice gets
    /// one of its size).
    private static var compactBufferSize: Int { 64 << 10 }

    /// Queues `chunk` as it is if it fills most of its storage, else copies it into a buffer of
    /// the queue's own: a slice pins its whole storage while it waits. NIOSSL hands each read's
    /// records over as a slice of its read buffer, which grows to 512 KiB and is allocated anew
    /// at that size for the next read while a slice of it lives: a megabyte of records waiting
    /// held 22 MB. `lastIsOwn` says whether the last buffer is one of ours that nobody has
    /// been handed a slice of yet, so the next small chunk can be appended to it; the caller
    /// clears it when it hands buffers out. `copyingAll` copies a chunk that fills its storage
    /// too, so that its storage is never pinned.
    @_spi(Stacks) public mutating func appendCompactly(_ chunk: ByteBuffer, lastIsOwn: inout Bool, copyingAll: Bool = false) {
        guard copyingAll || chunk.storageCapacity > 2 * chunk.readableBytes else {
            append(chunk)
            lastIsOwn = false
            return
        }
        var chunk = chunk
        if lastIsOwn, (self.last?.writableBytes ?? 0) >= chunk.readableBytes {
            // Taken out to be written: written through the subscript (a get, then a set) it is
            // referenced twice meanwhile, and the write copied all of it each time.
            var own = removeLast()
            own.writeBuffer(&chunk)
            append(own)
            return
        }
        var own = ByteBuffer()
        own.reserveCapacity(Swift.max(Self.compactBufferSize, chunk.readableBytes))
        own.writeBuffer(&chunk)
        append(own)
        lastIsOwn = true
    }
}
