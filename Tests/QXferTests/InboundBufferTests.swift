import Foundation
import NIOCore
import Testing
@_spi(Stacks) @testable import QXferCore

/// The connection's receive buffer: small slices of big read buffers (TLS records off a WAN path,
/// each a slice of NIOSSL's read buffer) are copied into compact buffers instead of pinning their
/// storage, and every byte still comes out once, in order.
@Suite("Receive buffering")
struct InboundBufferTests {
    /// Hands out one scripted read (several buffers), then the end of the stream.
    final class Reads: ByteStreamTransport, @unchecked Sendable {
        // Only the one reader of a test touches `reads`.
        private var reads: [[ByteBuffer]]
        let peer = PeerIdentity(fingerprint: nil, trust: .unauthenticated, applicationProtocol: "qxfer/1")
        init(_ reads: [[ByteBuffer]]) { self.reads = reads }
        func read() async throws -> [ByteBuffer]? { reads.isEmpty ? nil : reads.removeFirst() }
        func write(_ buffer: ByteBuffer) async throws {}
        func finish() async throws {}
        func reset(errorCode: UInt64) {}
        func close() {}
        func metrics() async -> ConnectionMetrics { ConnectionMetrics() }
        var multiplexer: (any StreamMultiplexer)? { nil }
    }

    /// `count` bytes of `source` from `offset`, as a slice of a 64 KiB storage of their own.
    static func slice(of source: [UInt8], at offset: Int, count: Int) -> ByteBuffer {
        var big = ByteBuffer()
        big.reserveCapacity(64 << 10)
        big.writeBytes(source[offset..<offset + count])
        return big.readSlice(length: count)!
    }

    @Test("Small slices of big buffers are held compactly and arrive intact, mixed with whole buffers")
    func smallSlicesAreCompacted() async throws {
        var generator = SystemRandomNumberGenerator()
        let source = (0..<(600 << 10)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        var buffers: [ByteBuffer] = []
        var offset = 0
        var index = 0
        while offset < source.count {
            // 1448-byte slices (a TCP segment's worth), and now and then a whole 48 KiB buffer.
            let count = min(index % 50 == 49 ? 48 << 10 : 1448, source.count - offset)
            buffers.append(index % 50 == 49 ? ByteBuffer(bytes: source[offset..<offset + count]) : Self.slice(of: source, at: offset, count: count))
            offset += count
            index += 1
        }
        let inbound = InboundBuffer()
        let transport = Reads([buffers])
        var received: [UInt8] = []
        var (first, _) = try await inbound.receive(from: transport, atLeast: 1, atMost: 1)
        received += first.readBytes(length: first.readableBytes)!
        // About 400 slices wait now: as slices they would hold 400 storages of 64 KiB (25 MiB).
        let held = await inbound.storageHeld
        #expect(held < 2 * source.count, "the queued chunks hold \(held) bytes of storage for \(source.count - 1) bytes")
        while received.count < source.count {
            var (chunk, _) = try await inbound.receive(from: transport, atLeast: 1, atMost: 7000)
            received += chunk.readBytes(length: chunk.readableBytes)!
        }
        #expect(received == source)
    }

    /// Whether anything besides `buffer` holds its storage: writing a byte in place then copies it.
    static func isShared(_ buffer: inout ByteBuffer) -> Bool {
        let before = buffer.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
        buffer.setInteger(buffer.getInteger(at: buffer.readerIndex, as: UInt8.self)!, at: buffer.readerIndex)
        return buffer.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) } != before
    }

    @Test("A long exact receive gathers its bytes as they arrive: the transport's buffers are let go at once, the bytes after it kept")
    func longReceivesAreGathered() async throws {
        var generator = SystemRandomNumberGenerator()
        let part = 40 << 10
        let source = (0..<(10 * part + 100)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        // Ten reads of 40 KiB, each a slice of a 64 KiB storage (held as they are, such slices
        // pin 1.6 times their bytes); the last also brings 100 bytes of what follows.
        var reads = (0..<10).map { Self.slice(of: source, at: $0 * part, count: $0 == 9 ? part + 100 : part) }
        let inbound = InboundBuffer()
        let transport = FedStream()
        let receive = Task { try await inbound.receive(from: transport, atLeast: 10 * part, atMost: 10 * part) }
        for index in 0..<5 { transport.feed(reads[index]) }
        try #require(await eventually { transport.readsAsked >= 6 }, "the receive asking for its sixth read")
        #expect(transport.readsAsked == 6)
        // Five reads in, the receive waits for the sixth: none of their storages is held any more.
        #expect((0..<5).filter { Self.isShared(&reads[$0]) }.isEmpty)
        let held = await inbound.storageHeld
        #expect(held <= 512 << 10, "\(held) bytes of storage held for 200 KiB of a 400 KiB receive")
        for index in 5..<10 { transport.feed(reads[index]) }
        var (body, _) = try await receive.value
        #expect(body.readBytes(length: body.readableBytes)! == Array(source[..<(10 * part)]))
        transport.close()
        var (rest, _) = try await inbound.receive(from: transport, atLeast: 1, atMost: 1000)
        #expect(rest.readBytes(length: rest.readableBytes)! == Array(source[(10 * part)...]))
    }

    @Test("A long receive cut short keeps every byte gathered: a receive after the failure still reads them")
    func gatheredBytesSurviveAnEnd() async throws {
        let source = [UInt8](repeating: 7, count: 300 << 10)
        let inbound = InboundBuffer()
        let transport = Reads([[Self.slice(of: source, at: 0, count: 50 << 10)], [Self.slice(of: source, at: 50 << 10, count: 50 << 10)]])
        let error = await #expect(throws: QXferError.self) { _ = try await inbound.receive(from: transport, atLeast: 300 << 10, atMost: 300 << 10) }
        #expect(error?.code == .truncated)
        var (held, complete) = try await inbound.receive(from: transport, atLeast: 1, atMost: 1 << 20)
        #expect(held.readableBytes == 100 << 10 && complete)
        #expect(held.readBytes(length: held.readableBytes)! == Array(source[..<(100 << 10)]))
    }

    @Test("Small slices are appended to the compact buffer in place: its storage stays where it is")
    func compactAppendsWriteInPlace() {
        var queue = CircularBuffer<ByteBuffer>()
        var lastIsOwn = false
        var addresses: Set<UInt> = []
        for index in 0..<20 {
            queue.appendCompactly(Self.slice(of: [UInt8](repeating: UInt8(index), count: 1448), at: 0, count: 1448), lastIsOwn: &lastIsOwn)
            addresses.insert(queue.last!.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) })
        }
        // Written through the queue's subscript, the buffer was referenced twice during each
        // write and copied whole (64 KiB for each 1448 bytes): a new address every time.
        #expect(queue.count == 1 && addresses.count == 1, "\(queue.count) buffers, \(addresses.count) addresses")
        #expect(Array(queue[queue.startIndex].readableBytesView) == (0..<20).flatMap { [UInt8](repeating: UInt8($0), count: 1448) })
    }
}
