import Testing
import QUICEngine
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC

/// What a ``QUIC`` stack's parameters make of the engine's configuration.
@Suite("QUIC stack configuration")
struct QUICStackConfigurationTests {
    private func make(_ mode: PerformanceMode, isServer: Bool, peerIsLoopback: Bool) -> QUICConfiguration {
        let parameters = NetworkParameters(stack: QUIC()).performanceMode(mode)
        let verifier = PeerVerifier(isServer ? .server(.optional) : .client(.knownHosts(), hostKey: "peer"))
        return QUICStackConfiguration.make(
            QUIC(), identity: Identities.server, parameters: parameters, verifier: verifier, isServer: isServer,
            peerIsLoopback: peerIsLoopback)
    }

    @Test("Bulk windows start at their ceilings towards a remote peer, and lower towards a loopback one",
          arguments: [false, true])
    func bulkWindowsFollowThePeer(isServer: Bool) {
        let remote = make(.bulk, isServer: isServer, peerIsLoopback: false)
        #expect(remote.initialStreamWindow == remote.maxStreamWindow)
        #expect(remote.initialConnectionWindow == remote.maxConnectionWindow)

        let loopback = make(.bulk, isServer: isServer, peerIsLoopback: true)
        #expect(loopback.initialStreamWindow == 4 << 20)
        #expect(loopback.initialConnectionWindow == 8 << 20)
        #expect(loopback.maxStreamWindow == remote.maxStreamWindow, "the same ceilings: a fast reader's windows still grow")
        #expect(loopback.maxConnectionWindow == remote.maxConnectionWindow)
        #expect(loopback.maxStreamSendBuffer == remote.maxStreamSendBuffer)
    }

    @Test("Outside bulk mode a loopback peer changes nothing")
    func otherModesIgnoreLoopback() {
        for mode in [PerformanceMode.default, .realtime] {
            let remote = make(mode, isServer: true, peerIsLoopback: false)
            let loopback = make(mode, isServer: true, peerIsLoopback: true)
            #expect(remote.initialStreamWindow == loopback.initialStreamWindow)
            #expect(remote.initialConnectionWindow == loopback.initialConnectionWindow)
        }
    }
}
