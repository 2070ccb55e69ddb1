import QUICEngine
import Testing

/// Hostile input: random and mutated datagrams must be dropped (or fail one connection
/// cleanly), never crash, and never disturb an established connection.
@Suite struct FuzzTests {
    static func mutate(_ datagram: [UInt8], rng: inout TestRNG) -> [UInt8] {
        var d = datagram
        switch rng.below(5) {
        case 0: // flip bits
            for _ in 0..<(1 + rng.below(8)) where !d.isEmpty { d[Int(rng.below(UInt64(d.count)))] ^= UInt8(1 << rng.below(8)) }
        case 1: // truncate
            d = Array(d.prefix(Int(rng.below(UInt64(d.count) + 1))))
        case 2: // overwrite a header byte range
            for i in 0..<min(d.count, Int(1 + rng.below(24))) { d[i] = UInt8(truncatingIfNeeded: rng.next()) }
        case 3: // append junk
            d += rng.bytes(Int(rng.below(64)))
        default: // completely random of the same length
            d = rng.bytes(d.count)
        }
        return d
    }

    @Test(arguments: [111, 112, 113] as [UInt64])
    func garbageNeverCrashesAndConnectionSurvives(seed: UInt64) throws {
        var rng = TestRNG(seed: seed)
        let sim = try Simulation(seed: seed, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))

        // 1. Pure random datagrams and mutated client Initials at a fresh server endpoint.
        let initial = Array(try #require(sim.client.pollTransmit(now: sim.nowTime)).segments[0])
        let serverConfig = QUICConfiguration.test(.server, expectPeer: nil)
        for i in 0..<300 {
            let datagram = i % 2 == 0 ? rng.bytes(Int(rng.below(1500))) : Self.mutate(initial, rng: &rng)
            _ = QUICPacketHeader.decode(datagram: datagram, shortHeaderConnectionIDLength: 16)
            guard let accepted = QUICInitialPacket.accept(datagram: datagram) else { continue }
            let path = QUICPath(local: sim.serverAddress, remote: QUICSocketAddress(ipAddress: "10.9.9.9", port: 9)!)
            guard let server = try? QUICConnection(serverWith: serverConfig, initialPacket: accepted, path: path, now: sim.nowTime) else { continue }
            try? server.handle(datagram: datagram, path: path, now: sim.nowTime)
            while server.pollTransmit(now: sim.nowTime) != nil {}
            while server.pollEvent() != nil {}
            server.handleTimeout(now: sim.nowTime.advanced(by: .seconds(60)))
        }

        // 2. A real connection; mutated copies of its own packets and random junk are injected
        // into both directions during the handshake and a transfer.
        sim.inject(initial, to: .server)
        var copies: [[UInt8]] = []
        sim.filter = { _, datagram in
            if copies.count < 400 { copies.append(datagram) }
            return false
        }
        let transfer = BulkTransfer(sim: sim, size: 512 << 10)
        let appStep = sim.onStep
        var injected = 0
        sim.onStep = {
            appStep?()
            guard injected < 2000, !copies.isEmpty else { return }
            for _ in 0..<4 {
                let base = copies[Int(rng.below(UInt64(copies.count)))]
                let junk = rng.chance(0.2) ? rng.bytes(Int(rng.below(1400))) : Self.mutate(base, rng: &rng)
                sim.inject(junk, to: rng.chance(0.5) ? .client : .server)
                injected += 1
            }
        }
        sim.run(for: 120_000 * ms) { transfer.complete || sim.client.isClosed }
        #expect(injected > 500, "seed \(seed): only \(injected) hostile datagrams injected")
        #expect(transfer.complete && !transfer.corrupt, "seed \(seed): \(transfer.received)")
        #expect(sim.closeReason(.client) == nil && sim.closeReason(.server) == nil, "seed \(seed)")
    }
}
