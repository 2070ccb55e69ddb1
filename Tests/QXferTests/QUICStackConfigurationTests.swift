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

    @Test("A listener's connections share one budget of receive windows; past it each gets the floor, and an ended one gives its window back")
    func receiveWindowsShareABudget() {
        let budget = ReceiveWindowBudget(bytes: 40 << 20)
        var first = make(.bulk, isServer: true, peerIsLoopback: false)  // 32 MiB
        let firstWindow = budget.limit(&first)
        #expect(firstWindow == 32 << 20 && first.initialConnectionWindow == 32 << 20 && first.maxConnectionWindow == 32 << 20)

        var second = make(.bulk, isServer: true, peerIsLoopback: false)
        #expect(budget.limit(&second) == 8 << 20, "what is left")
        #expect(second.initialConnectionWindow == 8 << 20 && second.maxConnectionWindow == 8 << 20)

        var flood: [UInt64] = []
        for _ in 0..<4096 {
            var next = make(.bulk, isServer: true, peerIsLoopback: false)
            flood.append(budget.limit(&next))
            #expect(next.initialConnectionWindow == ReceiveWindowBudget.floor && next.maxConnectionWindow == ReceiveWindowBudget.floor)
        }
        #expect(budget.taken == (40 << 20) + 4096 * ReceiveWindowBudget.floor, "the budget plus a floor per connection, never more")

        var small = make(.default, isServer: true, peerIsLoopback: false)
        let smallWindow = budget.limit(&small)
        #expect(smallWindow == ReceiveWindowBudget.floor)

        budget.giveBack(firstWindow)
        for window in flood { budget.giveBack(window) }
        budget.giveBack(smallWindow)
        var later = make(.bulk, isServer: true, peerIsLoopback: true)  // 8 MiB first, 32 MiB ceiling
        #expect(budget.limit(&later) == 32 << 20, "the ended connections' windows are free again")
        #expect(later.initialConnectionWindow == 8 << 20 && later.maxConnectionWindow == 32 << 20)
        #expect(budget.taken == 40 << 20)

        let tiny = ReceiveWindowBudget(bytes: 0)
        #expect(tiny.take(upTo: 64 << 10) == 64 << 10, "a connection that wants less than the floor gets what it wants")
    }
}
