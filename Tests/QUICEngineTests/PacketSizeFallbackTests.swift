@testable import QUICEngine
import Testing

/// A path whose MTU drops under an established connection (docs/ARCHITECTURE.md, "Packet
/// sizes"): full-size packets vanish, and only packets of QUIC's smallest size get through.
@Suite(.serialized) struct PacketSizeFallbackTests {
    /// A 20 ms RTT, 100 Mbit/s path in both directions.
    static func simulation(seed: UInt64, probedSize: Int? = nil, rate: UInt64 = 100_000_000) throws -> Simulation {
        var clientConfiguration = QUICConfiguration.test(.client, expectPeer: .server)
        // As qxfer's connector after its probe before the handshake: that size from the start.
        clientConfiguration.maxUDPPayloadSize = probedSize
        let sim = try Simulation(seed: seed, client: clientConfiguration, server: .test(.server, expectPeer: nil))
        for d in [\Simulation.up, \Simulation.down] {
            sim[keyPath: d].delay = 10 * ms
            sim[keyPath: d].rate = rate
        }
        return sim
    }

    static func limits(_ events: [QUICEvent]) -> [Int?] {
        events.compactMap { if case .packetSizeLimited(let size) = $0 { size } else { nil } }
    }

    /// After 4 of 16 MiB the client's path carries 1232 bytes at most (IPv6's minimum MTU):
    /// the transfer must finish at the link's rate after a stall of a few probe timeouts.
    /// Before the fallback the client sent full-size packets until its idle timeout, and the
    /// test failed with 4 MiB received.
    @Test(arguments: [(171, nil), (172, 1472)] as [(UInt64, Int?)])
    func fallsBackWhenThePathMTUDropsMidTransfer(seed: UInt64, probedSize: Int?) throws {
        let sim = try Self.simulation(seed: seed, probedSize: probedSize)
        let size = 16 << 20
        var droppedAt: UInt64?
        var largestBeforeDrop = 0
        var fellBack = false
        var largestAfterFallback = 0
        sim.onEvent = { side, event in
            if side == .client, case .packetSizeLimited(1200) = event { fellBack = true }
        }
        let t = BulkTransfer(sim: sim, size: size)  // after onEvent: it chains the handler
        sim.onTransmit = { side, transmit in
            guard side == .client else { return }
            if droppedAt == nil { largestBeforeDrop = max(largestBeforeDrop, transmit.segmentSize) }
            if fellBack { largestAfterFallback = max(largestAfterFallback, transmit.segmentSize) }
        }
        t.trigger = (4 << 20, {
            sim.up.mtu = 1232
            droppedAt = sim.now
        })
        sim.run(for: 60_000 * ms) { t.complete || sim.client.isClosed }
        TransferTests.check(sim, t, size: size)
        #expect(largestBeforeDrop > 1232, "seed \(seed): packets of \(largestBeforeDrop) bytes before the drop: nothing to fall back from")
        #expect(Self.limits(sim.clientEvents) == [1200], "seed \(seed): \(Self.limits(sim.clientEvents))")
        #expect(sim.client.stats.maxUDPPayloadSize == 1200)
        // Full-size packets written before the fallback may still leave; every later one fits.
        #expect(largestAfterFallback > 0 && largestAfterFallback <= 1200, "seed \(seed): packets of \(largestAfterFallback) bytes after the fallback")
        // 12 MiB at 100 Mbit/s take 1.0 s; with the two probe timeouts and the recovery of a
        // lost window, 1.3 s for both seeds.
        let afterDrop = Double(sim.now - (droppedAt ?? sim.now)) / 1e9
        #expect(afterDrop <= 2.0, "seed \(seed): \(afterDrop) s from the drop to the end")
    }

    /// An outage looks like a black hole for a while: packets fall back to 1200 bytes, and once
    /// the hold ends (10 s) and packets are acknowledged, full-size packets are tried again and
    /// kept, since they arrive.
    @Test func liftsTheLimitAfterAnOutage() throws {
        let sim = try Self.simulation(seed: 173, rate: 8_000_000)
        var outageEnds: UInt64 = 0
        sim.filter = { _, _ in sim.now < outageEnds }
        var liftedAt: UInt64?
        var largestAfterLift = 0
        sim.onEvent = { side, event in
            if side == .client, case .packetSizeLimited(nil) = event { liftedAt = sim.now }
        }
        sim.onTransmit = { side, transmit in
            if side == .client, liftedAt != nil { largestAfterLift = max(largestAfterLift, transmit.segmentSize) }
        }
        let size = 20 << 20
        let t = BulkTransfer(sim: sim, size: size)
        t.trigger = (2 << 20, { outageEnds = sim.now + 1_500 * ms })
        sim.run(for: 120_000 * ms) { t.complete || sim.client.isClosed }
        TransferTests.check(sim, t, size: size)
        #expect(Self.limits(sim.clientEvents) == [1200, nil], "\(Self.limits(sim.clientEvents))")
        #expect(largestAfterLift > 1200, "packets of at most \(largestAfterLift) bytes after the limit was lifted")
        #expect(sim.client.stats.maxUDPPayloadSize > 1200)
    }

    /// The rules alone: two probe timeouts in a row set the ceiling; it is lifted only once the
    /// hold has passed with packets acknowledged; each new fallback holds twice as long.
    @Test func holdsDoubleAndLiftOnlyWhileAcknowledged() {
        var fallback = PacketSizeFallback()
        let start = QUICTime(nanoseconds: 1_000_000_000)
        func at(_ seconds: Int64) -> QUICTime { start.advanced(by: .seconds(seconds)) }

        #expect(fallback.update(packetSize: 1452, probeTimeouts: 1, now: start) == nil)
        #expect(fallback.update(packetSize: 1200, probeTimeouts: 5, now: start) == nil, "already the smallest")
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 2, now: start) == .limited(to: 1200))
        #expect(fallback.limit(1452) == 1200 && fallback.limit(1000) == 1000)
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 0, now: at(9)) == nil, "within the first hold (10 s)")
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 3, now: at(11)) == nil, "nothing acknowledged yet")
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 0, now: at(11)) == .lifted)
        #expect(fallback.limit(1452) == 1452)

        #expect(fallback.update(packetSize: 1452, probeTimeouts: 2, now: at(12)) == .limited(to: 1200))
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 0, now: at(31)) == nil, "the second hold is 20 s")
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 0, now: at(32)) == .lifted)
        for _ in 0..<10 {
            _ = fallback.update(packetSize: 1452, probeTimeouts: 2, now: at(100))
            _ = fallback.update(packetSize: 1452, probeTimeouts: 0, now: at(100_000))
        }
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 2, now: at(200_000)) == .limited(to: 1200))
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 0, now: at(200_299)) == nil)
        #expect(fallback.update(packetSize: 1452, probeTimeouts: 0, now: at(200_300)) == .lifted, "holds stop at 300 s")
    }
}
