import Foundation
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// A QUIC listener validating client addresses with Retry (RFC 9000 §8.1.2): always, and once
/// too many handshakes are pending.
@Suite("QUIC listener address validation with Retry")
struct QUICRetryTests {
    @Test("With Retry for every client, a real client goes through the Retry round trip and is served",
          .timeLimit(.minutes(1)))
    func alwaysRetry() async throws {
        let listener = NetworkListener(
            on: 0, host: "127.0.0.1", using: .parameters { QUIC().identity(Identities.server) }, retryAbovePendingHandshakes: 0)
        try await withListener(listener, handler: QUICHostileTests.echo) { port in
            try await QUICHostileTests.echoOnce(port: port)
            // A raw Initial from another socket gets a Retry, smaller than itself, and no state.
            let initial = try await QUICHostileTests.captureClientInitial()
            let prober = try UDPSocket()
            prober.send(initial, to: port)
            let answer = try #require(await prober.receive(within: .seconds(5)), "no answer to an Initial")
            #expect(answer.bytes[0] & 0xf0 == 0xf0, "expected a Retry packet, got first byte \(answer.bytes[0])")
            #expect(answer.bytes.count < initial.count)
        }
    }

    @Test("Past 64 new connections in a second, bogus Initials get stateless Retries and a real client still connects",
          .timeLimit(.minutes(2)))
    func retryUnderLoad() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        try await withListener(listener, handler: QUICHostileTests.echo) { port in
            var random = SplitMix64(seed: UInt64.random(in: 0...UInt64.max))
            let attacker = try UDPSocket()
            var retries = 0
            let started = ContinuousClock.now
            for index in 0..<300 {
                // Well-formed v1 Initials that pass ngtcp2_accept and then fail decryption: the
                // first 64 in a second cost a connection set-up each, the rest only a Retry.
                let dcid = random.bytes(8 + Int(random.next() % 13))
                var packet: [UInt8] = [0xc3, 0, 0, 0, 1, UInt8(dcid.count)] + dcid + [0, 0]
                let remaining = 1200 - packet.count - 2
                packet += [0x40 | UInt8(remaining >> 8), UInt8(remaining & 0xff)]
                packet += random.bytes(remaining)
                attacker.send(packet, to: port)
                if index % 50 == 49 { try await Task.sleep(for: .milliseconds(20)) }
                while let answer = attacker.receive(timeout: .zero) {
                    if answer.bytes[0] & 0xf0 == 0xf0 { retries += 1 }
                }
            }
            // A real client, whose Initial queues behind the burst, connects once the listener
            // has worked through it: the time until then bounds the listener's (silence does not:
            // an Initial that costs a set-up gets no answer, and under AddressSanitizer beside
            // every other suite the listener answered nothing for the first 3 s).
            try await QUICHostileTests.echoOnce(port: port)
            let seconds = Int((ContinuousClock.now - started).components.seconds) + 2
            while let answer = await attacker.receive(within: .milliseconds(500)) {
                if answer.bytes[0] & 0xf0 == 0xf0 { retries += 1 }
            }
            // At most 64 connections begin per calendar second (fewer while 32 are pending), and
            // one source's bucket answers its first 256 datagrams at once (then 128 a second), so
            // over the time the listener took, every other Initial within that burst got a Retry.
            // A listener slowed to under 64 set-ups a second owes none: it was never past the limit.
            let answerable = min(300, QUICSocketHandler.sourceBurst)
            #expect(retries >= max(0, answerable - 64 * seconds), "only \(retries) Retries for 300 Initials in about \(seconds) s")
        }
    }
}
