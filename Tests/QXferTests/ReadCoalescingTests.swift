import Foundation
import NIOCore
import Testing
import QXfer
@_spi(Stacks) @testable import QXferQUIC

/// A bulk transfer's QUIC socket pauses after a small read on a long path (``ReadCoalescing``):
/// the policy at fixed inputs, then a bulk transfer across a delayed relay, where both ends pause.
@Suite("QUIC read coalescing on long paths")
struct ReadCoalescingTests {
    static let millisecond: Int64 = 1_000_000

    static let busy = 32

    /// The policy after a read of `messages`, with the socket's smallest RTT `roundTrip`.
    static func pause(after messages: Int, roundTrip: Int64?) -> Int64? {
        var coalescing = ReadCoalescing(busyReadMessages: busy)
        for _ in 0..<messages { coalescing.receivedMessage() }
        return coalescing.pauseBeforeNextRead { roundTrip }
    }

    @Test("After a small read the pause is 1/50 of the RTT, at most 1 ms until the arrival rate is known; none on a short path")
    func pauseFollowsTheRoundTrip() {
        #expect(Self.pause(after: 1, roundTrip: 50 * Self.millisecond) == Self.millisecond)
        #expect(Self.pause(after: 3, roundTrip: 10 * Self.millisecond) == 200_000)
        #expect(Self.pause(after: 0, roundTrip: 200 * Self.millisecond) == Self.millisecond)
        // 2.5 ms of RTT is the shortest that pauses (50 µs); below, the timer would cost more.
        #expect(Self.pause(after: 1, roundTrip: 2_500_000) == 50_000)
        #expect(Self.pause(after: 1, roundTrip: 2_499_999) == nil)
        #expect(Self.pause(after: 1, roundTrip: 100_000) == nil)
    }

    @Test("On a long path the pause grows past 1 ms, to 1/50 of the RTT and at most 4 ms, only while a full read takes that long to arrive")
    func pauseFollowsTheArrivalRate() {
        var coalescing = ReadCoalescing(busyReadMessages: Self.busy)
        func pause(after messages: Int, roundTrip: Int64 = 200 * Self.millisecond) -> Int64? {
            for _ in 0..<messages { coalescing.receivedMessage() }
            return coalescing.pauseBeforeNextRead { roundTrip }
        }
        #expect(pause(after: 2) == Self.millisecond)  // the rate is not known yet
        #expect(pause(after: 8) == 4 * Self.millisecond)  // 8 in 1 ms: a full read takes 4 ms
        #expect(pause(after: 20) == 4 * Self.millisecond)  // one would take 6.4 ms: at most 4 ...
        #expect(pause(after: 10, roundTrip: 100 * Self.millisecond) == 2 * Self.millisecond)  // ... and 1/50 of the RTT
        #expect(pause(after: 0) == 4 * Self.millisecond)  // nothing came in 2 ms: the longest
        #expect(pause(after: Self.busy) == nil)  // a full read: at once, and the rate is not known
        #expect(pause(after: 16) == Self.millisecond)
        #expect(pause(after: 16) == 2 * Self.millisecond)  // 16 in 1 ms: a full read takes 2 ms
        #expect(pause(after: 30, roundTrip: 50 * Self.millisecond) == Self.millisecond)  // 1/50 of 50 ms
    }

    @Test("A read that stopped at the channel's limit, a connection without an RTT sample, or none at all: read at once")
    func noPause() {
        #expect(Self.pause(after: Self.busy, roundTrip: 50 * Self.millisecond) == nil)
        #expect(Self.pause(after: Self.busy - 1, roundTrip: 50 * Self.millisecond) != nil)
        #expect(Self.pause(after: 1, roundTrip: nil) == nil)
        #expect(Self.pause(after: 1, roundTrip: 0) == nil)
    }

    @Test("Messages count from one read request to the next; the RTT is asked only after a read that emptied the socket")
    func countsPerRead() {
        var coalescing = ReadCoalescing(busyReadMessages: Self.busy)
        var asked = 0
        for _ in 0..<Self.busy { coalescing.receivedMessage() }
        #expect(coalescing.pauseBeforeNextRead { asked += 1; return 50 * Self.millisecond } == nil)
        #expect(asked == 0)
        #expect(coalescing.messagesSinceRead == 0)
        #expect(!coalescing.longPath)  // not known yet: datagrams are answered one by one
        coalescing.receivedMessage()
        coalescing.receivedMessage()
        #expect(coalescing.pauseBeforeNextRead { asked += 1; return 50 * Self.millisecond } == Self.millisecond)
        #expect(asked == 1)
        #expect(coalescing.longPath)  // now at each read's end ...
        for _ in 0..<Self.busy { coalescing.receivedMessage() }
        #expect(coalescing.pauseBeforeNextRead { 50 * Self.millisecond } == nil)
        #expect(coalescing.longPath)  // ... a busy read changes nothing ...
        coalescing.receivedMessage()
        #expect(coalescing.pauseBeforeNextRead { 1 * Self.millisecond } == nil)
        #expect(!coalescing.longPath)  // ... a short path does
    }

    @Test("A bulk transfer over a 40 ms round trip, where both sockets pause between small reads, arrives whole")
    func bulkTransferAcrossALongPath() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1", using: .parameters {
            QUIC().identity(Identities.server)
        }.performanceMode(.bulk))
        let counted: @Sendable (NetworkConnection<QUIC>) async throws -> Void = { connection in
            var total = 0
            var digest = 0
            while true {
                do {
                    let chunk = try await connection.receive(atLeast: 1, atMost: 1 << 20).content
                    for byte in chunk { digest = (digest &* 31) &+ Int(byte) }
                    total += chunk.count
                } catch let error as QXferError where error.code == .endOfStream { break }
            }
            try await connection.send(Data("\(total) \(digest)".utf8))
        }
        try await withListener(listener, handler: counted) { port in
            let relay = try await UDPRelay.start(to: try SocketAddress(ipAddress: "127.0.0.1", port: Int(port)))
            relay.delay(.milliseconds(20))
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: relay.port), using: .parameters {
                QUIC().identity(Identities.client).peerFingerprint(Identities.server.fingerprint)
            }.performanceMode(.bulk))
            var digest = 0
            var sent = 0
            for index in 0..<24 {
                let chunk = Data((0..<(512 << 10)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ index) })
                for byte in chunk { digest = (digest &* 31) &+ Int(byte) }
                try await connection.send(chunk)
                sent += chunk.count
            }
            try await connection.finish()
            let reply = try await connection.receive(atLeast: 1, atMost: 64).content
            #expect(String(decoding: reply, as: UTF8.self) == "\(sent) \(digest)")
            connection.cancel()
            await relay.stop()
        }
    }
}
