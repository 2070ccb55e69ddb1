import Testing
@testable import QXferStream

/// The per-second report counts frames lost in the interval from gaps in the frame indices.
struct IntervalLossTests {
    @Test func gapsInFrameIndicesAreLostFramesOfTheirInterval() {
        var stats = StreamStatistics()
        let clock = ClockOffsetEstimator()
        for index: UInt64 in [0, 1, 2, 5] {  // 3 and 4 missing
            stats.record(latency: 1_000_000, bytes: 100, onTime: true, arrival: index, index: index)
        }
        let first = stats.takeInterval(seconds: 1, clock: clock)
        #expect(first.framesDelivered == 4 && first.framesLost == 2)
        #expect(first.json(elapsed: 1).contains("\"frames_lost\":2"))
        // A lost frame is counted once; one arriving late after all is not counted again.
        stats.record(latency: 1_000_000, bytes: 100, onTime: false, arrival: 6, index: 3)
        stats.record(latency: 1_000_000, bytes: 100, onTime: true, arrival: 7, index: 6)
        let second = stats.takeInterval(seconds: 1, clock: clock)
        #expect(second.framesLost == 0 && second.framesDelivered == 1 && second.framesLate == 1)
        // Without indices, nothing is reported lost.
        var unindexed = StreamStatistics()
        unindexed.record(latency: 1_000_000, bytes: 100, onTime: true, arrival: 0)
        #expect(unindexed.takeInterval(seconds: 1, clock: clock).framesLost == 0)
    }
}
