import QUICEngine
import Testing

/// A connection's streams share one stream's worth of send buffer, each keeping a floor: many
/// busy streams towards a reader slower than the path hold about what one stream would, not a
/// full buffer each (a sender of many small files keeps 8 streams busy).
@Suite struct SharedSendBufferTests {
    @Test(arguments: [41, 42] as [UInt64])
    func eightStreamsTowardsASlowReaderHoldWhatOneWould(seed: UInt64) throws {
        let configuration = WANRateTests.bulk(.test(.client, expectPeer: .server))
        let sim = try Simulation(seed: seed, client: configuration,
                                 server: WANRateTests.bulk(.test(.server, expectPeer: nil)))
        for direction in [\Simulation.up, \Simulation.down] {
            sim[keyPath: direction].delay = 5 * ms
            sim[keyPath: direction].rate = 400_000_000
        }
        let streams = 8
        let transfer = BulkTransfer(sim: sim, size: 6 << 20, streams: streams)
        transfer.writerWaitsForWritable = true
        transfer.readRate = 8_000_000  // bytes per virtual second: the disk lags the network
        sim.tick = 1 * ms               // the reader wakes up every millisecond
        sim.run(for: 60_000 * ms) { transfer.complete || sim.client.isClosed }
        TransferTests.check(sim, transfer, size: 6 << 20)
        // One stream's limit on this path (its floor: the slow reader's credit holds it there),
        // plus the floor of every stream and a block each for rounding.
        let bound = configuration.streamSendBufferLimit + streams * (64 << 10 + 16 << 10)
        #expect(transfer.maxBufferedAtClientInAll <= bound,
                "seed \(seed): the streams held \(transfer.maxBufferedAtClientInAll) bytes together, bound \(bound)")
        #expect(transfer.maxBufferedAtClientInAll >= configuration.streamSendBufferLimit / 2,
                "seed \(seed): the streams held only \(transfer.maxBufferedAtClientInAll) bytes: the bound proves nothing")
    }
}
