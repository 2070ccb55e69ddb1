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

    /// Hands out scripted reads of `source`, each first buffer with the room asked for in front
    /// when `honoursHeadroom`, and remembers what was asked and where its storage lies.
    final class RoomyReads: ByteStreamTransport, @unchecked Sendable {
        // Only the one reader of a test touches these.
        private var sizes: [Int]
        private let source: [UInt8]
        private var offset = 0
        private let honoursHeadroom: Bool
        var asked: [(minimum: Int, headroom: Int)] = []
        var storages: [UnsafeRawPointer] = []
        let peer = PeerIdentity(fingerprint: nil, trust: .unauthenticated, applicationProtocol: "qxfer/1")
        init(_ source: [UInt8], sizes: [Int], honoursHeadroom: Bool) {
            self.source = source
            self.sizes = sizes
            self.honoursHeadroom = honoursHeadroom
        }
        func read() async throws -> [ByteBuffer]? { try await read(atLeast: 1, headroom: 0) }
        func read(atLeast minimum: Int) async throws -> [ByteBuffer]? { try await read(atLeast: minimum, headroom: 0) }
        func read(atLeast minimum: Int, headroom: Int) async throws -> [ByteBuffer]? {
            asked.append((minimum, headroom))
            guard !sizes.isEmpty else { return nil }
            let count = sizes.removeFirst()
            let room = honoursHeadroom ? headroom : 0
            var buffer = ByteBuffer()
            buffer.reserveCapacity(room + count)
            buffer.moveWriterIndex(forwardBy: room)
            buffer.moveReaderIndex(forwardBy: room)
            buffer.writeBytes(source[offset..<offset + count])
            offset += count
            storages.append(buffer.withVeryUnsafeBytes { UnsafeRawPointer($0.baseAddress!) })
            return [buffer]
        }
        func write(_ buffer: ByteBuffer) async throws {}
        func finish() async throws {}
        func reset(errorCode: UInt64) {}
        func close() {}
        func metrics() async -> ConnectionMetrics { ConnectionMetrics() }
        var multiplexer: (any StreamMultiplexer)? { nil }
    }

    @Test("A message spanning what is held and the next read ends in the read's own buffer, the held part moved in front", arguments: [true, false])
    func heldBytesGoInFrontOfTheNextRead(honoursHeadroom: Bool) async throws {
        let source = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ $0 >> 9) }
        // A header read brings 300 bytes; the 1 MiB - 10 message's rest comes in one read.
        let transport = RoomyReads(source, sizes: [300, source.count - 300], honoursHeadroom: honoursHeadroom)
        let inbound = InboundBuffer()
        let (header, _) = try await inbound.receive(from: transport, atLeast: 10, atMost: 10)
        #expect(Array(header.readableBytesView) == Array(source[0..<10]))
        let (body, _) = try await inbound.receive(from: transport, atLeast: source.count - 10, atMost: source.count - 10)
        #expect(Array(body.readableBytesView) == Array(source[10...]))
        #expect(transport.asked.map(\.minimum) == [10, source.count - 300])
        #expect(transport.asked.map(\.headroom) == [0, 290])
        // With the room given, the message is the second read's buffer; without, a join of its own.
        let bodyStorage = body.withVeryUnsafeBytes { UnsafeRawPointer($0.baseAddress!) }
        #expect((bodyStorage == transport.storages[1]) == honoursHeadroom)
        await #expect(throws: QXferError.self) { _ = try await inbound.receive(from: transport, atLeast: 1, atMost: 1) }
    }
}
