import QUICEngine
import Testing

@Suite struct DatagramTests {
    @Test(arguments: [81, 82] as [UInt64])
    func datagramsFlowAndNeverQueueUnboundedly(seed: UInt64) throws {
        var client = QUICConfiguration.test(.client, expectPeer: .server)
        client.maxQueuedOutgoingDatagrams = 32
        let sim = try Simulation(seed: seed, client: client, server: .test(.server, expectPeer: nil))
        sim.up.loss = 0.1
        sim.up.rate = 10_000_000
        #expect(sim.runHandshake())
        let max = try #require(sim.client.maxDatagramPayloadSize)
        #expect(max > 1000 && max < 1200, "max payload \(max)")
        #expect(throws: QUICEngineError(.datagramRejected, "")) { try sim.client.sendDatagram([UInt8](repeating: 0, count: max + 1)) }

        // Burst far more than the queue holds, without letting the engine transmit.
        for i in 0..<1000 {
            try sim.client.sendDatagram([UInt8(i & 0xff), UInt8(i >> 8)] + [UInt8](repeating: 0xab, count: 500))
            #expect(sim.client.queuedOutgoingDatagrams <= 32)
        }
        #expect(sim.client.stats.datagramsDroppedOutgoing == 1000 - 32)
        // Then a steady stream the link can carry.
        var next = 1000
        sim.onStep = {
            while next < 1200 && sim.client.queuedOutgoingDatagrams < 4 {
                try? sim.client.sendDatagram([UInt8(next & 0xff), UInt8(next >> 8)] + [UInt8](repeating: 0xcd, count: max - 2))
                next += 1
            }
        }
        sim.run(for: 5_000 * ms) { next == 1200 && sim.client.queuedOutgoingDatagrams == 0 }
        sim.run(for: 200 * ms) { false }
        let received = sim.serverEvents.compactMap { e -> [UInt8]? in
            if case .datagramReceived(let d) = e { return d } else { return nil }
        }
        let ids = received.map { Int($0[0]) | Int($0[1]) << 8 }
        #expect(received.count > 150, "seed \(seed): only \(received.count) datagrams arrived")
        #expect(received.count <= 32 + 200, "seed \(seed)")
        #expect(Set(ids).count == ids.count, "datagrams are never retransmitted")
        #expect(ids.filter { $0 < 1000 }.allSatisfy { $0 >= 1000 - 32 }, "only the newest queued datagrams survive")
        #expect(received.allSatisfy { $0.count == 502 || $0.count == max })
    }

    @Test func datagramsRejectedWhenPeerDisablesThem() throws {
        var server = QUICConfiguration.test(.server, expectPeer: nil)
        server.maxDatagramFrameSize = 0
        let sim = try Simulation(seed: 83, client: .test(.client, expectPeer: .server), server: server)
        #expect(sim.runHandshake())
        #expect(sim.client.maxDatagramPayloadSize == nil)
        #expect(throws: QUICEngineError(.datagramRejected, "")) { try sim.client.sendDatagram([1]) }
    }

    @Test func incomingDatagramsAreBounded() throws {
        var server = QUICConfiguration.test(.server, expectPeer: nil)
        server.maxQueuedIncomingDatagrams = 8
        let sim = try Simulation(seed: 84, client: .test(.client, expectPeer: .server), server: server)
        #expect(sim.runHandshake())
        for i in 0..<20 { try sim.client.sendDatagram([UInt8(i)]) }
        // Deliver everything without letting the server application poll events.
        while let t = sim.client.pollTransmit(now: sim.nowTime) {
            for s in t.segments { try sim.server!.handle(datagram: Array(s), path: QUICPath(local: sim.serverAddress, remote: t.path.local), now: sim.nowTime) }
        }
        var got = 0
        while let e = sim.server!.pollEvent() { if case .datagramReceived = e { got += 1 } }
        #expect(got == 8)
        #expect(sim.server!.stats.datagramsDroppedIncoming == 12)
    }
}
