import CNGTCP2
@testable import QUICEngine
import Testing

/// The send buffer against a plain array: whatever mix of writes, sends and acknowledgements,
/// ngtcp2 is handed the written bytes in order, across block boundaries, and the counts follow.
@Suite struct StreamSendBufferTests {
    /// The bytes ngtcp2 would take from the buffer: up to `limit` of the vectors it is offered.
    private static func take(from buffer: StreamSendBuffer, limit: Int) -> [UInt8] {
        let vecs = UnsafeMutableBufferPointer<ngtcp2_vec>.allocate(capacity: 16)
        defer { vecs.deallocate() }
        var taken: [UInt8] = []
        for i in 0..<buffer.unsentVectors(into: vecs) where taken.count < limit {
            let n = min(vecs[i].len, limit - taken.count)
            taken += UnsafeBufferPointer(start: vecs[i].base, count: n)
        }
        buffer.markSent(taken.count)
        return taken
    }

    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func handsOverWhatWasWrittenInOrder(seed: UInt64) {
        var rng = TestRNG(seed: seed)
        let block = StreamSendBuffer.blockSize
        let buffer = StreamSendBuffer(pool: SendBlockPool())
        let limit = 40 * block
        var written: [UInt8] = []
        var sent: [UInt8] = []
        var acked = 0
        var next: UInt8 = 0
        for _ in 0..<600 {
            switch rng.below(3) {
            case 0:
                let length = [1, 1200, block - 1, block, block + 1, 5 * block][Int(rng.below(6))]
                let bytes = (0..<length).map { _ in next &+= 1; return next }
                let accepted = bytes.withUnsafeBytes { buffer.append($0, limit: limit) }
                #expect(accepted == min(length, limit - (written.count - acked)))
                written += bytes[..<accepted]
            case 1:
                let wanted = [1, 1452, block, 20 * block][Int(rng.below(4))]
                let taken = Self.take(from: buffer, limit: wanted)
                // Sixteen vectors cover at least fifteen whole blocks.
                #expect(taken.count == min(wanted, written.count - sent.count) || taken.count >= 15 * block)
                #expect(taken[...] == written[sent.count..<sent.count + taken.count])
                sent += taken
            default:
                let offset = acked + Int(rng.below(UInt64(sent.count - acked + 1)))
                #expect(buffer.acknowledge(upTo: UInt64(offset)) == offset - acked)
                acked = offset
            }
            #expect(buffer.bufferedBytes == written.count - acked)
            #expect(buffer.unsentBytes == written.count - sent.count)
        }
        while buffer.unsentBytes > 0 { sent += Self.take(from: buffer, limit: .max) }
        #expect(sent == written)
    }

    @Test func rewindHandsEverythingOverAgainUntilSomethingIsAcknowledged() {
        let buffer = StreamSendBuffer(pool: SendBlockPool())
        let bytes = (0..<(3 * StreamSendBuffer.blockSize + 7)).map { UInt8(truncatingIfNeeded: $0 * 7) }
        #expect(bytes.withUnsafeBytes { buffer.append($0, limit: .max) } == bytes.count)
        #expect(Self.take(from: buffer, limit: .max) == bytes)
        #expect(buffer.rewind())
        #expect(Self.take(from: buffer, limit: .max) == bytes)
        buffer.acknowledge(upTo: 1)
        #expect(!buffer.rewind())
    }

    @Test func acknowledgementsBeyondWhatWasSentAreClamped() {
        let buffer = StreamSendBuffer(pool: SendBlockPool())
        let bytes = [UInt8](repeating: 9, count: 2 * StreamSendBuffer.blockSize)
        _ = bytes.withUnsafeBytes { buffer.append($0, limit: .max) }
        _ = Self.take(from: buffer, limit: StreamSendBuffer.blockSize + 10)
        #expect(buffer.acknowledge(upTo: .max) == StreamSendBuffer.blockSize + 10)
        #expect(Self.take(from: buffer, limit: .max).count == StreamSendBuffer.blockSize - 10)
    }
}
