@testable import QUICEngine
import Testing

/// The receive queue against a plain array: any interleaving of appends and reads of any sizes
/// returns the bytes in order, and its count follows.
@Suite struct ByteQueueTests {
    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func readsReturnWhatWasAppendedInOrder(seed: UInt64) {
        var rng = TestRNG(seed: seed)
        var queue = ByteQueue()
        var expected: [UInt8] = []
        var next: UInt8 = 0
        var got: [UInt8] = []
        for _ in 0..<400 {
            if rng.below(2) == 0 {
                // Sizes around and across the chunk boundary, and tiny ones.
                let length = [1, 1200, 8192, ByteQueue.chunkSize - 1, ByteQueue.chunkSize + 1, 3 * ByteQueue.chunkSize][Int(rng.below(6))]
                let bytes = [UInt8](unsafeUninitializedCapacity: length) { buffer, initialized in
                    for i in 0..<length { next &+= 1; buffer[i] = next }
                    initialized = length
                }
                bytes.withUnsafeBytes { queue.append($0) }
                expected += bytes
            } else {
                let capacity = [1, 1000, ByteQueue.chunkSize, 4 << 20][Int(rng.below(4))]
                var buffer = [UInt8](repeating: 0, count: capacity)
                let n = buffer.withUnsafeMutableBytes { queue.read(into: $0) }
                #expect(n == min(capacity, expected.count - got.count))
                got += buffer[..<n]
            }
            #expect(queue.count == expected.count - got.count)
        }
        var rest = [UInt8](repeating: 0, count: queue.count)
        let n = rest.withUnsafeMutableBytes { queue.read(into: $0) }
        got += rest[..<n]
        #expect(got == expected)
        #expect(queue.isEmpty)
    }
}
