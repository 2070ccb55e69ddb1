import QUICEngine
import Testing

@Suite(.serialized) struct StreamTests {
    static func lossyLink(_ sim: Simulation, loss: Double) {
        for direction in [\Simulation.up, \Simulation.down] {
            sim[keyPath: direction].loss = loss
            sim[keyPath: direction].jitter = 3 * ms
            sim[keyPath: direction].rate = 100_000_000
        }
    }

    @Test(arguments: [41, 42] as [UInt64])
    func hundredParallelStreams(seed: UInt64) throws {
        let sim = try Simulation(seed: seed, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        Self.lossyLink(sim, loss: 0.02)
        let t = BulkTransfer(sim: sim, size: 64 << 10, streams: 100)
        sim.run(for: 300_000 * ms) { t.complete || sim.client.isClosed }
        #expect(t.complete, "seed \(seed): \(t.finished.count) of 100 streams finished")
        #expect(!t.corrupt, "seed \(seed)")
        #expect(t.sent.count == 100 && t.received.count == 100, "seed \(seed)")
        #expect(t.received.values.allSatisfy { $0 == 64 << 10 }, "seed \(seed)")
        let opened = sim.serverEvents.filter { if case .streamOpened = $0 { true } else { false } }.count
        #expect(opened == 100, "seed \(seed)")
        #expect(sim.maxSegmentCount > 1, "seed \(seed): expected GSO batches")
    }

    /// A reader slower than the link: the engine must hold at most the flow-control window
    /// at the receiver and the send-buffer limit at the sender, and the transfer must be
    /// paced by the reader.
    @Test(arguments: [51, 52] as [UInt64])
    func slowReaderBoundsBufferedBytes(seed: UInt64) throws {
        var client = QUICConfiguration.test(.client, expectPeer: .server)
        client.streamSendBufferLimit = 128 << 10
        var server = QUICConfiguration.test(.server, expectPeer: nil)
        server.initialStreamWindow = 64 << 10
        server.maxStreamWindow = 256 << 10
        server.initialConnectionWindow = 128 << 10
        server.maxConnectionWindow = 512 << 10
        let sim = try Simulation(seed: seed, client: client, server: server)
        Self.lossyLink(sim, loss: 0.01)
        let size = 2 << 20
        let t = BulkTransfer(sim: sim, size: size)
        t.readRate = 1_000_000 // 1 MB/s against a 100 Mbit/s link
        sim.tick = 1 * ms        // the reader wakes up every millisecond
        sim.runHandshake()
        let start = sim.now
        sim.run(for: 600_000 * ms) { t.complete || sim.client.isClosed }
        #expect(t.complete && !t.corrupt, "seed \(seed)")
        #expect(t.maxBufferedAtServer > 0)
        #expect(t.maxBufferedAtServer <= 256 << 10, "seed \(seed): server buffered \(t.maxBufferedAtServer)")
        #expect(t.maxBufferedAtClient <= 128 << 10, "seed \(seed): client buffered \(t.maxBufferedAtClient)")
        let seconds = Double(sim.now - start) / 1e9
        print("slow reader seed \(seed): server held at most \(t.maxBufferedAtServer) B, client at most \(t.maxBufferedAtClient) B, \(seconds) s")
        #expect(seconds >= 0.9 * Double(size) / 1_000_000, "seed \(seed): finished in \(seconds)s, faster than the reader")
    }

    @Test func resetAndStopSendingReachThePeer() throws {
        let sim = try Simulation(seed: 61, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        #expect(sim.runHandshake())
        let a = try #require(try sim.client.openStream())
        let b = try #require(try sim.client.openStream())
        _ = try sim.client.write(stream: a, bytes: [1, 2, 3])
        _ = try sim.client.write(stream: b, bytes: [4, 5, 6])
        sim.run(for: 1_000 * ms) { sim.server?.readableBytes(stream: b) == 3 && sim.server?.readableBytes(stream: a) == 3 }
        try sim.client.reset(stream: a, errorCode: 7)
        try #require(sim.server).stopSending(stream: b, errorCode: 9)
        sim.run(for: 200 * ms) { sim.serverEvents.contains(.streamReset(a, errorCode: 7)) }
        // The client notices STOP_SENDING when it next has data for the stream.
        _ = try sim.client.write(stream: b, bytes: [7, 8, 9])
        sim.run(for: 1_000 * ms) { sim.clientEvents.contains(.streamStopSending(b, errorCode: nil)) }
        #expect(sim.serverEvents.contains(.streamReset(a, errorCode: 7)))
        #expect(sim.clientEvents.contains(.streamStopSending(b, errorCode: nil)))
        #expect(throws: QUICEngineError(.invalidStreamState, "")) { try sim.client.write(stream: b, bytes: [1]) }
        #expect(sim.server?.readableBytes(stream: a) == 0)
        #expect(throws: QUICEngineError(.invalidStreamState, "")) { try sim.client.write(stream: a, bytes: [1]) }
        #expect(throws: QUICEngineError(.unknownStream, "")) { try sim.client.write(stream: QUICStreamID(rawValue: 400), bytes: [1]) }
    }

    @Test func unidirectionalStreamAndFinOnly() throws {
        let sim = try Simulation(seed: 62, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        #expect(sim.runHandshake())
        let uni = try #require(try sim.client.openStream(bidirectional: false))
        #expect(!uni.isBidirectional && uni.isClientInitiated)
        _ = try sim.client.write(stream: uni, bytes: Array("hello".utf8), finish: true)
        let empty = try #require(try sim.client.openStream())
        try sim.client.finish(stream: empty)
        var got: [UInt8] = []
        var finishedUni = false, finishedEmpty = false
        sim.onStep = {
            guard let server = sim.server else { return }
            if let r = try? server.read(stream: uni) {
                got += r.bytes
                finishedUni = finishedUni || r.isFinished
            }
            if let r = try? server.read(stream: empty) { finishedEmpty = finishedEmpty || r.isFinished }
        }
        sim.run(for: 1_000 * ms) { finishedUni && finishedEmpty }
        #expect(String(decoding: got, as: UTF8.self) == "hello")
        #expect(finishedUni && finishedEmpty)
        #expect(sim.serverEvents.contains(.streamFinished(uni)))
    }

    @Test(arguments: [QUICConfiguration.CongestionControl.bbr, .bbr2, .reno])
    func otherCongestionControllers(cc: QUICConfiguration.CongestionControl) throws {
        let (sim, t) = try TransferTests.run(seed: 71, size: 2 << 20, loss: 0.02, cc: cc)
        TransferTests.check(sim, t, size: 2 << 20)
    }
}
