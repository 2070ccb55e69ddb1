import QUICEngine
import Testing

/// Address validation with Retry (RFC 9000 §8.1.2), as the listener uses it under load.
@Suite struct RetryTests {
    /// The server answers the first Initial with a Retry; the client follows it, echoes the
    /// token, checks the server's retry transport parameters, and the connection carries data.
    @Test(arguments: [131, 132] as [UInt64])
    func clientFollowsRetryAndConnects(seed: UInt64) throws {
        let sim = try Simulation(seed: seed, client: .test(.client, expectPeer: .server), server: .test(.server, expectPeer: nil))
        sim.requireRetry = true
        #expect(sim.runHandshake(), "seed \(seed)")
        #expect(sim.retriesSent == 1)
        #expect(sim.acceptedAfterRetry)
        let stream = try #require(try sim.client.openStream())
        let payload = (0..<50_000).map { UInt8(truncatingIfNeeded: $0) }
        _ = try sim.client.write(stream: stream, bytes: payload, finish: true)
        var received: [UInt8] = []
        sim.run(for: 5_000 * ms) {
            if let read = try? sim.server!.read(stream: stream) { received += read.bytes }
            return received.count == payload.count
        }
        #expect(received == payload, "seed \(seed)")
        #expect(sim.serverErrors.isEmpty)
    }

    /// A token is good only for the address it was issued to, only for the connection ID the
    /// Retry named, and only for a while; anything else is not a Retry token.
    @Test func tokensAreBoundToAddressConnectionAndTime() throws {
        let secret = (0..<32).map { UInt8($0) }
        let client = QUICSocketAddress(ipAddress: "192.0.2.1", port: 5000)!
        let original = QUICConnectionID([1, 2, 3, 4, 5, 6, 7, 8])!
        let retryID = QUICConnectionID(Array(repeating: 9, count: 16))!
        let first = QUICInitialPacket(version: 1, destinationConnectionID: original, sourceConnectionID: QUICConnectionID([7, 7])!, token: [])
        let issued = QUICTime(nanoseconds: 1_000_000_000_000)
        let retry = try #require(QUICRetry.write(for: first, remote: client, secret: secret, retryConnectionID: retryID, now: issued))
        #expect(retry[0] & 0xf0 == 0xf0, "a v1 Retry packet (long header, type 3)")
        #expect(retry.count < 1200, "smaller than the Initial it answers")

        // The token sits at the end of the packet, before the 16-byte integrity tag.
        let header = 1 + 4 + 1 + 2 + 1 + 16  // flags, version, DCID len + client SCID (2), SCID len + retry ID
        let token = Array(retry[header..<(retry.count - 16)])
        var echoed = first
        echoed.destinationConnectionID = retryID
        echoed.token = token
        #expect(QUICRetry.validate(echoed, remote: client, secret: secret, now: issued) == original)

        let elsewhere = QUICSocketAddress(ipAddress: "192.0.2.2", port: 5000)!
        #expect(QUICRetry.validate(echoed, remote: elsewhere, secret: secret, now: issued) == nil)
        var otherID = echoed
        otherID.destinationConnectionID = QUICConnectionID(Array(repeating: 8, count: 16))!
        #expect(QUICRetry.validate(otherID, remote: client, secret: secret, now: issued) == nil)
        let later = QUICTime(nanoseconds: issued.nanoseconds + 11_000_000_000)
        #expect(QUICRetry.validate(echoed, remote: client, secret: secret, now: later) == nil)
        #expect(QUICRetry.validate(echoed, remote: client, secret: secret.reversed(), now: issued) == nil)
        var forged = echoed
        forged.token[forged.token.count / 2] ^= 1
        #expect(QUICRetry.validate(forged, remote: client, secret: secret, now: issued) == nil)
        #expect(QUICRetry.validate(first, remote: client, secret: secret, now: issued) == nil)
    }
}
