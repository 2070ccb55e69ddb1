import QUICEngine
import Testing

@Suite(.serialized) struct PathTests {
    static func pathChanges(_ events: [QUICEvent]) -> [QUICPath] {
        events.compactMap { if case .pathChanged(let p) = $0 { p } else { nil } }
    }

    /// The client's NAT picks a new public port mid-transfer: the server must validate the
    /// new path and continue there, without the client doing anything.
    @Test(arguments: [121, 122, 123] as [UInt64])
    func natRebindingMidTransfer(seed: UInt64) throws {
        let sim = try Simulation(seed: seed, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        for d in [\Simulation.up, \Simulation.down] {
            sim[keyPath: d].loss = 0.01
            sim[keyPath: d].jitter = 2 * ms
            sim[keyPath: d].rate = 100_000_000
        }
        let t = BulkTransfer(sim: sim, size: 2 << 20)
        t.trigger = (1 << 20, { sim.rebindClientNAT(toPort: 61000) })
        sim.run(for: 120_000 * ms) { t.complete || sim.client.isClosed }
        #expect(t.complete && !t.corrupt, "seed \(seed): \(t.received)")
        let rebound = QUICSocketAddress(ipAddress: "192.0.2.7", port: 61000)!
        #expect(sim.server?.path.remote == rebound, "seed \(seed): server path \(String(describing: sim.server?.path))")
        #expect(Self.pathChanges(sim.serverEvents).last?.remote == rebound, "seed \(seed)")
        #expect(sim.serverEvents.contains { if case .pathValidated(let p, true) = $0 { p.remote == rebound } else { false } },
                "seed \(seed): no successful path validation")
        #expect(sim.closeReason(.client) == nil, "seed \(seed)")
    }

    /// The client moves to a new local address mid-transfer (immediate migration).
    @Test(arguments: [131, 132, 133] as [UInt64])
    func clientMigrationMidTransfer(seed: UInt64) throws {
        let sim = try Simulation(seed: seed, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        for d in [\Simulation.up, \Simulation.down] {
            sim[keyPath: d].loss = 0.01
            sim[keyPath: d].jitter = 2 * ms
            sim[keyPath: d].rate = 100_000_000
        }
        let t = BulkTransfer(sim: sim, size: 2 << 20)
        var migrationError: Error?
        t.trigger = (1 << 20, {
            do { try sim.migrateClient(toPort: 62000) } catch { migrationError = error }
        })
        sim.run(for: 120_000 * ms) { t.complete || sim.client.isClosed }
        #expect(migrationError == nil, "seed \(seed): \(String(describing: migrationError))")
        #expect(t.complete && !t.corrupt, "seed \(seed): \(t.received)")
        let newAddress = QUICSocketAddress(ipAddress: "10.0.1.2", port: 62000)!
        #expect(sim.client.path.local == newAddress, "seed \(seed)")
        #expect(Self.pathChanges(sim.clientEvents).last?.local == newAddress, "seed \(seed)")
        #expect(sim.server?.path.remote == newAddress, "seed \(seed)")
        // Migration retires the old connection ID and uses a new one the server issued.
        #expect(sim.serverEvents.contains { if case .connectionIDRetired = $0 { true } else { false } }, "seed \(seed)")
    }

    @Test func serverCannotMigrateAndClientNeedsHandshake() throws {
        let sim = try Simulation(seed: 134, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        let addr = QUICSocketAddress(ipAddress: "10.0.1.2", port: 1)!
        #expect(throws: QUICEngineError(.pathError, "")) { try sim.client.migrate(toLocalAddress: addr, now: sim.nowTime) }
        #expect(sim.runHandshake())
        #expect(throws: QUICEngineError(.wrongRole, "")) { try sim.server!.migrate(toLocalAddress: addr, now: sim.nowTime) }
    }

    @Test func addressConversions() throws {
        let v4 = try #require(QUICSocketAddress(ipAddress: "192.0.2.1", port: 443))
        #expect(v4.description == "192.0.2.1:443" && !v4.isIPv6)
        let v6 = try #require(QUICSocketAddress(ipAddress: "2001:db8::1", port: 8443))
        #expect(v6.isIPv6 && v6.description == "[2001:db8:0:0:0:0:0:1]:8443")
        for a in [v4, v6] {
            let back = a.withSockaddrBytes { QUICSocketAddress(sockaddrBytes: $0) }
            #expect(back == a)
        }
        #expect(QUICSocketAddress(ipAddress: "not an address", port: 1) == nil)
        #expect(QUICSocketAddress(addressBytes: [1, 2, 3], port: 1) == nil)
        #expect(QUICSocketAddress(sockaddrBytes: UnsafeRawBufferPointer(start: nil, count: 0)) == nil)
        #expect(QUICTime(nanoseconds: 5).advanced(by: .milliseconds(1)).nanoseconds == 1_000_005)
        #expect(QUICTime.distantFuture.advanced(by: .seconds(1)) == .distantFuture)
    }
}
