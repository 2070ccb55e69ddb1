import QUICEngine
import Testing

@Suite struct LifecycleTests {
    @Test(arguments: [91, 92] as [UInt64])
    func idleTimeoutClosesBothSides(seed: UInt64) throws {
        var client = QUICConfiguration.test(.client, expectPeer: .server)
        client.idleTimeout = .seconds(2)
        var server = QUICConfiguration.test(.server, expectPeer: nil)
        server.idleTimeout = .seconds(3)
        let sim = try Simulation(seed: seed, client: client, server: server)
        #expect(sim.runHandshake())
        let idleStart = sim.now
        sim.run(for: 10_000 * ms) { sim.client.isTerminated && sim.server!.isTerminated }
        for side in [Side.client, .server] {
            let reason = try #require(sim.closeReason(side), "seed \(seed): \(side) did not close")
            #expect(reason.kind == .idleTimeout, "seed \(seed): \(side) \(reason)")
            #expect(!reason.initiatedByPeer)
        }
        #expect(sim.client.isTerminated && sim.server!.isTerminated)
        // The effective timeout is the smaller of the two (2 s); allow the 3×PTO slack ngtcp2 adds.
        #expect(sim.now - idleStart >= 2_000 * ms && sim.now - idleStart < 3_000 * ms, "seed \(seed)")
        #expect(sim.client.nextTimeout == nil)
    }

    /// Only the server's answers are lost (UDP blocked one way): the client's handshake times
    /// out and it says so, so the server, which took the connection, ends it at once rather
    /// than at its idle timeout.
    @Test func handshakeTimeoutIsToldToThePeer() throws {
        var client = QUICConfiguration.test(.client, expectPeer: .server)
        client.handshakeTimeout = .seconds(1)
        var server = QUICConfiguration.test(.server, expectPeer: nil)
        server.idleTimeout = .seconds(30)
        let sim = try Simulation(seed: 98, client: client, server: server)
        sim.down.loss = 1
        let start = sim.now
        sim.run(for: 10_000 * ms) { sim.closeReason(.client) != nil && sim.closeReason(.server) != nil }
        let clientReason = try #require(sim.closeReason(.client))
        #expect(clientReason.kind == .handshakeTimeout && !clientReason.initiatedByPeer, "\(clientReason)")
        let serverReason = try #require(sim.closeReason(.server), "the server did not hear the client give up")
        #expect(serverReason.initiatedByPeer, "\(serverReason)")
        #expect(sim.now - start < 1_100 * ms, "the server learnt it after \((sim.now - start) / ms) ms")
    }

    /// A keep-alive holds the path open for this side's own idle timeout, never past a shorter one
    /// the peer asked for. The server pings every 5 s; the client asked to close after 2 s without
    /// traffic. On a 2 s round trip three probe timeouts exceed 5 s, and the server's PINGs held
    /// the client open for as long as they came (CI saw 132 s instead of 2-18 s on a loaded
    /// machine, where the probe timeout grew the same way).
    @Test(arguments: [95, 96] as [UInt64])
    func peersKeepAliveDoesNotOutliveAShorterIdleTimeout(seed: UInt64) throws {
        let sim = try Self.keepAliveSimulation(seed: seed, clientIdleTimeout: .seconds(2))
        let stats = sim.client.stats
        let probeTimeout = stats.smoothedRTT + max(stats.rttVariance * 4, .milliseconds(1)) + .milliseconds(25)
        let idlePeriod = max(Duration.seconds(2), probeTimeout * 3)
        #expect(idlePeriod > .seconds(6), "seed \(seed): the path must make 3 PTO exceed the peer's keep-alive")
        let idleStart = sim.now
        sim.run(for: 300_000 * ms) { sim.client.isTerminated && sim.server!.isTerminated }
        for side in [Side.client, .server] {
            let reason = try #require(sim.closeReason(side), "seed \(seed): \(side) never closed")
            #expect(reason.kind == .idleTimeout, "seed \(seed): \(side) \(reason)")
        }
        let closedAfter = Duration.nanoseconds(Int64(sim.now - idleStart))
        #expect(closedAfter <= idlePeriod + .seconds(2), "seed \(seed): closed after \(closedAfter), idle period \(idlePeriod)")
    }

    /// The same path with a peer whose idle timeout is not shorter: the PINGs keep both sides open.
    @Test func keepAliveHoldsAnEqualIdleTimeout() throws {
        let sim = try Self.keepAliveSimulation(seed: 97, clientIdleTimeout: .seconds(30))
        sim.run(for: 300_000 * ms) { sim.client.isTerminated || sim.server!.isTerminated }
        #expect(sim.closeReason(.client) == nil && sim.closeReason(.server) == nil)
    }

    /// A handshake over a 2 s round trip to a server that keeps its path alive every 5 s.
    private static func keepAliveSimulation(seed: UInt64, clientIdleTimeout: Duration) throws -> Simulation {
        var client = QUICConfiguration.test(.client, expectPeer: .server)
        client.idleTimeout = clientIdleTimeout
        var server = QUICConfiguration.test(.server, expectPeer: nil)
        server.idleTimeout = .seconds(30)
        server.keepAliveInterval = .seconds(5)
        let sim = try Simulation(seed: seed, client: client, server: server)
        sim.up.delay = 1_000 * ms
        sim.down.delay = 1_000 * ms
        #expect(sim.runHandshake(timeLimit: 60_000 * ms), "seed \(seed)")
        return sim
    }

    @Test(arguments: [93, 94] as [UInt64])
    func applicationCloseDeliversCodeAndReason(seed: UInt64) throws {
        let sim = try Simulation(seed: seed, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        sim.up.loss = 0.3 // the CONNECTION_CLOSE may be lost; the closing period re-sends it
        sim.down.loss = 0.3
        #expect(sim.runHandshake(timeLimit: 30_000 * ms), "seed \(seed)")
        sim.up.loss = 0
        sim.down.loss = 0
        sim.client.close(errorCode: 0x42, reason: "done, thanks", now: sim.nowTime)
        #expect(throws: QUICEngineError(.connectionClosed, "")) { try sim.client.openStream() }
        sim.run(for: 10_000 * ms) { sim.client.isTerminated && sim.server!.isTerminated }
        let local = try #require(sim.closeReason(.client))
        #expect(local == QUICCloseReason(kind: .application, code: 0x42, reason: "done, thanks", initiatedByPeer: false))
        let remote = try #require(sim.closeReason(.server), "seed \(seed)")
        #expect(remote == QUICCloseReason(kind: .application, code: 0x42, reason: "done, thanks", initiatedByPeer: true))
        #expect(sim.client.isTerminated && sim.server!.isTerminated)
    }

    @Test func clientRefusingServerCertificateFailsBothSides() throws {
        var client = QUICConfiguration.test(.client, expectPeer: .server)
        client.verifyPeer = { _ in false }
        let sim = try Simulation(seed: 95, client: client, server: .test(.server, expectPeer: nil))
        sim.run(for: 5_000 * ms) { sim.closeReason(.client) != nil && sim.closeReason(.server) != nil }
        let local = try #require(sim.closeReason(.client))
        #expect(local.isCryptoError && !local.initiatedByPeer, "\(local)")
        let remote = try #require(sim.closeReason(.server))
        #expect(remote.isCryptoError && remote.initiatedByPeer, "\(remote)")
        #expect(!sim.client.isHandshakeComplete && !sim.server!.isHandshakeComplete)
        #expect(!sim.clientEvents.contains { if case .handshakeCompleted = $0 { true } else { false } })
        #expect(throws: QUICEngineError(.connectionClosed, "")) { try sim.client.openStream() }
    }

    @Test func serverRefusingClientCertificateFailsBothSides() throws {
        var server = QUICConfiguration.test(.server, expectPeer: .client)
        server.clientAuthentication = .required
        server.verifyPeer = { _ in false }
        let sim = try Simulation(seed: 96, client: .test(.client, expectPeer: .server), server: server)
        sim.run(for: 5_000 * ms) { sim.closeReason(.client) != nil && sim.closeReason(.server) != nil }
        let local = try #require(sim.closeReason(.server))
        #expect(local.isCryptoError && !local.initiatedByPeer, "\(local)")
        let remote = try #require(sim.closeReason(.client))
        #expect(remote.isCryptoError && remote.initiatedByPeer, "\(remote)")
        #expect(!sim.serverEvents.contains { if case .handshakeCompleted = $0 { true } else { false } })
    }

    @Test func missingRequiredClientCertificateFails() throws {
        var server = QUICConfiguration.test(.server, expectPeer: .client)
        server.clientAuthentication = .required
        let client = QUICConfiguration(certificateChainPEM: TestIdentity.client.certificatePEM,
                                       privateKeyPEM: TestIdentity.client.privateKeyPEM, verifyPeer: { _ in true })
        // Same client, but the server requires and the client is configured: succeeds.
        let ok = try Simulation(seed: 97, client: client, server: server)
        #expect(ok.runHandshake() && ok.server?.peerCertificate == TestIdentity.client.leafDER)
        // Optional: client certificate still sent and exposed.
        server.clientAuthentication = .optional
        let optional = try Simulation(seed: 98, client: client, server: server)
        #expect(optional.runHandshake() && optional.server?.peerCertificate == TestIdentity.client.leafDER)
        // None: no client certificate.
        server.clientAuthentication = .none
        let none = try Simulation(seed: 99, client: client, server: server)
        #expect(none.runHandshake() && none.server?.isHandshakeComplete == true && none.server?.peerCertificate == nil)
    }

    @Test func alpnMismatchFailsHandshake() throws {
        var client = QUICConfiguration.test(.client, expectPeer: .server)
        client.applicationProtocols = ["other/1"]
        let sim = try Simulation(seed: 100, client: client, server: .test(.server, expectPeer: nil))
        sim.run(for: 5_000 * ms) { sim.closeReason(.client) != nil }
        let reason = try #require(sim.closeReason(.client))
        #expect(reason.isCryptoError, "\(reason)")
        #expect(!sim.client.isHandshakeComplete)
    }

    @Test func badPEMIsAConfigurationError() throws {
        let config = QUICConfiguration(certificateChainPEM: "nope", privateKeyPEM: "nope", verifyPeer: { _ in true })
        let path = QUICPath(local: QUICSocketAddress(ipAddress: "::1", port: 1)!, remote: QUICSocketAddress(ipAddress: "::1", port: 2)!)
        #expect(throws: QUICEngineError(.invalidConfiguration, "")) {
            _ = try QUICConnection(clientWith: config, path: path, now: QUICTime(nanoseconds: 1))
        }
        var noALPN = QUICConfiguration.test(.client, expectPeer: nil)
        noALPN.applicationProtocols = []
        #expect(throws: QUICEngineError(.invalidConfiguration, "")) {
            _ = try QUICConnection(clientWith: noALPN, path: path, now: QUICTime(nanoseconds: 1))
        }
    }

    @Test func statelessResetClosesClient() throws {
        let sim = try Simulation(seed: 101, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        #expect(sim.runHandshake())
        // The server's first CID and its token, as the server driver would keep them.
        guard case .connectionIDIssued(let cid, let token) = sim.serverEvents.first else {
            Issue.record("no connectionIDIssued first: \(sim.serverEvents)")
            return
        }
        #expect(token == QUICStatelessReset.token(secret: sim.serverConfiguration.statelessResetSecret, connectionID: cid))
        #expect(sim.server!.sourceConnectionIDs.contains(cid))
        let reset = try #require(QUICStatelessReset.write(token: token, triggeringPacketLength: 100))
        #expect(reset.count == 99 && reset[0] & 0xc0 == 0x40)
        #expect(QUICStatelessReset.write(token: token, triggeringPacketLength: 30) == nil)
        sim.server = nil // the server "lost its state"
        sim.inject(reset, to: .client)
        sim.run(for: 1_000 * ms) { sim.closeReason(.client) != nil }
        #expect(sim.closeReason(.client)?.kind == .statelessReset)
    }

    @Test("Every connection ID a server issues begins with its configured prefix; a prefix leaving fewer than 8 random bytes is refused")
    func connectionIDPrefix() throws {
        var server = QUICConfiguration.test(.server, expectPeer: nil)
        server.connectionIDPrefix = [0xab, 0xcd]
        let sim = try Simulation(seed: 104, client: .test(.client, expectPeer: .server), server: server)
        #expect(sim.runHandshake())
        sim.run(for: 500 * ms) { false }  // NEW_CONNECTION_ID frames after the handshake
        let issued = sim.serverEvents.compactMap { event -> QUICConnectionID? in
            if case .connectionIDIssued(let id, _) = event { return id }
            return nil
        }
        #expect(issued.count > 1, "the first connection ID and at least one NEW_CONNECTION_ID")
        #expect(issued.allSatisfy { $0.bytes.count == server.connectionIDLength && $0.bytes.starts(with: [0xab, 0xcd]) }, "\(issued)")
        #expect(sim.server!.sourceConnectionIDs.allSatisfy { $0.bytes.starts(with: [0xab, 0xcd]) })

        var tooLong = QUICConfiguration.test(.server, expectPeer: nil)
        tooLong.connectionIDPrefix = [UInt8](repeating: 1, count: 9)
        let path = QUICPath(local: QUICSocketAddress(ipAddress: "::1", port: 1)!, remote: QUICSocketAddress(ipAddress: "::1", port: 2)!)
        #expect(throws: QUICEngineError(.invalidConfiguration, "")) {
            _ = try QUICConnection(clientWith: tooLong, path: path, now: QUICTime(nanoseconds: 1))
        }
    }

    @Test func versionNegotiationForUnknownVersion() throws {
        let sim = try Simulation(seed: 102, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        let first = try #require(sim.client.pollTransmit(now: sim.nowTime))
        var initial = Array(first.segments[0])
        guard case .supported(let header) = QUICPacketHeader.decode(datagram: initial, shortHeaderConnectionIDLength: 16) else {
            Issue.record("client Initial not decodable")
            return
        }
        #expect(header.isLongHeader && header.version == 1)
        #expect(header.destinationConnectionID == sim.client.originalDestinationConnectionID)
        #expect(QUICInitialPacket.accept(datagram: initial)?.destinationConnectionID == header.destinationConnectionID)
        initial[1...4] = [0x1a, 0x2a, 0x3a, 0x4a]
        guard case .unsupportedVersion(let unknown) = QUICPacketHeader.decode(datagram: initial, shortHeaderConnectionIDLength: 16) else {
            Issue.record("unknown version not flagged")
            return
        }
        let vn = try #require(QUICVersionNegotiation.write(for: unknown))
        #expect(vn[0] & 0x80 != 0 && vn[1...4].allSatisfy { $0 == 0 })
        // The VN packet is addressed to the client's source CID and lists version 1.
        let dcidLength = Int(vn[5])
        #expect(Array(vn[6..<6 + dcidLength]) == header.sourceConnectionID.bytes)
        #expect(vn.suffix(8).contains(1) || QUICVersionNegotiation.supportedVersions.contains(1))
        #expect(QUICPacketHeader.decode(datagram: [], shortHeaderConnectionIDLength: 16) == .invalid)
    }
}
