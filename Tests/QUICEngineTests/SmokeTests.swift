import CNGTCP2
import QUICEngine
import Testing

@Suite struct SmokeTests {
    @Test func ngtcp2AndGnuTLSAreLinked() throws {
        let info = try #require(ngtcp2_version(0))
        #expect(String(cString: info.pointee.version_str) == "0.12.1")
        #expect(String(cString: cngtcp2_header_version()) == "0.12.1")
        let gnutls = try #require(gnutls_check_version(nil))
        #expect(String(cString: gnutls).hasPrefix("3."))
        #expect(gnutls_check_version("3.7.0") != nil)
    }

    @Test func handshakeCompletesWithPinnedCertificates() throws {
        var serverConfig = QUICConfiguration.test(.server, expectPeer: .client)
        serverConfig.clientAuthentication = .required
        let sim = try Simulation(seed: 1, client: .test(.client, expectPeer: .server), server: serverConfig)
        #expect(sim.runHandshake(), "seed \(sim.seed)")
        #expect(sim.clientEvents.contains(.handshakeCompleted(alpn: "qxfer/1")))
        #expect(sim.serverEvents.contains(.handshakeCompleted(alpn: "qxfer/1")))
        #expect(sim.client.peerCertificate == TestIdentity.server.leafDER)
        #expect(sim.server?.peerCertificate == TestIdentity.client.leafDER)
        #expect(sim.client.negotiatedALPN == "qxfer/1")
    }
}
