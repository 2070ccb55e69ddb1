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
}
