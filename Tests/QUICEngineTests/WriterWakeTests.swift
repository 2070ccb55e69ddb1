import QUICEngine
import Testing

/// A writer cut short hears ``QUICEvent/streamWritable(_:)`` as soon as its stream's limit
/// leaves room, not only when an acknowledgement moves the stream's acknowledged prefix: the
/// limit also grows with the peer's credit and with what the path carries. Woken only by the
/// prefix, a bulk sender behind a lost packet sat idle until the retransmission was
/// acknowledged, the path drained, and ngtcp2 0.12's rate sampler, fed a whole flight sent
/// before any acknowledgement came back, reported far more than the link carries
/// (docs/benchmarks.md, "Writers woken only when the acknowledged prefix moved").
@Suite struct WriterWakeTests {
    /// A reader that stops, then resumes: its credit arrives in a packet that acknowledges
    /// nothing new (everything sent before is acknowledged), and the writer must be woken by it,
    /// half a round trip after the reader resumes, not a round trip later by the
    /// acknowledgements of what that credit let out.
    @Test func creditFromAResumingReaderWakesTheWriter() throws {
        let rtt = 50 * ms
        let sim = try Simulation(seed: 31, client: WANRateTests.bulk(.test(.client, expectPeer: .server)),
                                 server: WANRateTests.bulk(.test(.server, expectPeer: nil)))
        for direction in [\Simulation.up, \Simulation.down] {
            sim[keyPath: direction].delay = rtt / 2
            sim[keyPath: direction].rate = WANRateTests.linkBitsPerSecond
            sim[keyPath: direction].maxQueueDelay = rtt
        }
        let transfer = BulkTransfer(sim: sim, size: 256 << 20)
        transfer.writerWaitsForWritable = true
        var stopped: UInt64?
        var resumed: UInt64?
        var wokenAfterResume: UInt64?
        let applicationStep = sim.onStep
        sim.onStep = {
            applicationStep?()
            let received = transfer.received.values.reduce(0, +)
            if stopped == nil, received >= 32 << 20 {
                stopped = sim.now  // the reader stops after 32 MiB, once the path is in use
                transfer.readBudgetPerStep = 0
            } else if let stopped, resumed == nil, sim.now >= stopped + 4 * rtt {
                resumed = sim.now  // the window is full and everything sent acknowledged by now
                transfer.readBudgetPerStep = nil
            }
        }
        let earlier = sim.onEvent
        sim.onEvent = { side, event in
            earlier?(side, event)
            if side == .client, case .streamWritable = event, resumed != nil, wokenAfterResume == nil {
                wokenAfterResume = sim.now
            }
        }
        sim.run(for: 5_000 * ms) { wokenAfterResume != nil || sim.client.isClosed }
        let resumedAt = try #require(resumed)
        let wokenAt = try #require(wokenAfterResume, "the writer was never woken after the reader resumed")
        // The credit takes half a round trip to reach the sender; acknowledgements of what it
        // lets out would take a whole one more.
        #expect(wokenAt - resumedAt < rtt, "woken \(Double(wokenAt - resumedAt) / 1e6) ms after the reader resumed")
    }
}
