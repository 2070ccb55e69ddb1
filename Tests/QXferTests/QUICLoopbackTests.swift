import Foundation
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// The same connection API over QUIC on real loopback sockets.
@Suite("QUIC over loopback")
struct QUICLoopbackTests {
    /// An echo listener: returns every byte it receives, until the client finishes.
    func echoListener(_ quic: QUIC) -> NetworkListener<QUIC> {
        NetworkListener(on: 0, host: "127.0.0.1") { quic }
    }

    static let echo: @Sendable (NetworkConnection<QUIC>) async throws -> Void = { try await echoUntilFinished($0) }

    @Test("A pinned QUIC connection echoes 8 MiB intact and reports metrics")
    func echoTransfer() async throws {
        let listener = echoListener(QUIC().identity(Identities.server))
        try await withListener(listener, handler: Self.echo) { port in
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                QUIC().identity(Identities.client).peerFingerprint(Identities.server.fingerprint)
            }
            let payload = (0..<(8 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 13) }
            async let sent: Void = {
                for offset in stride(from: 0, to: payload.count, by: 256 << 10) {
                    try await connection.send(payload[offset..<min(offset + (256 << 10), payload.count)])
                }
            }()
            let received = try await connection.receive(exactly: payload.count).content
            try await sent
            #expect(Array(received) == payload)
            #expect(connection.peer?.trust == .pinned)
            #expect(connection.peer?.applicationProtocol == "qxfer/1")
            let metrics = await connection.metrics
            #expect((metrics.smoothedRTT ?? .zero) > .zero)
            #expect((metrics.bytesSent ?? 0) >= payload.count)
            connection.cancel()
        }
    }

    @Test("A QUIC server whose fingerprint differs from the pin is refused")
    func wrongPin() async throws {
        let listener = echoListener(QUIC().identity(Identities.server))
        try await withListener(listener, handler: Self.echo) { port in
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                QUIC().identity(Identities.client).peerFingerprint(Identities.stranger.fingerprint)
            }
            let error = await #expect(throws: QXferError.self) { try await connection.send(Data("x".utf8)) }
            #expect(error?.code == .fingerprintMismatch)
            #expect(error?.message.contains(Identities.server.fingerprint.description) == true)
        }
    }

    @Test("QUIC mutual TLS admits the allowed client and refuses a stranger")
    func mutualTLS() async throws {
        let listener = echoListener(
            QUIC().identity(Identities.server).clientAuthentication(.required(allowing: [Identities.client.fingerprint])))
        try await withListener(listener, handler: Self.echo) { port in
            let allowed = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                QUIC().identity(Identities.client).peerFingerprint(Identities.server.fingerprint)
            }
            try await allowed.send(Data("ping".utf8))
            #expect(try await allowed.receive(exactly: 4).content == Data("ping".utf8))
            allowed.cancel()

            let stranger = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                QUIC().identity(Identities.stranger).peerFingerprint(Identities.server.fingerprint)
            }
            let error = await #expect(throws: QXferError.self) {
                try await stranger.send(Data("ping".utf8))
                _ = try await stranger.receive(exactly: 4)
            }
            #expect(error?.code == .untrustedPeer)
        }
    }

    @Test("Trust on first use works the same on QUIC")
    func trustOnFirstUse() async throws {
        let directory = TemporaryDirectory()
        let file = KnownHosts(path: directory.file("known_hosts"))
        let listener = echoListener(QUIC().identity(Identities.server))
        try await withListener(listener, handler: Self.echo) { port in
            for expected in [TrustDecision.firstUse(recordedIn: file.path), .knownHost] {
                let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                    QUIC().identity(Identities.client).peerTrust(.knownHosts(file))
                }
                try await connection.send(Data("hi".utf8))
                _ = try await connection.receive(exactly: 2)
                #expect(connection.peer?.trust == expected)
                connection.cancel()
            }
            #expect(try file.lookup("127.0.0.1:\(port)")?.fingerprint == Identities.server.fingerprint)
        }
    }

    @Test("A verified pin is recorded in known hosts on QUIC too, then known hosts alone verifies the receiver")
    func verifiedPinIsRecorded() async throws {
        let directory = TemporaryDirectory()
        let file = KnownHosts(path: directory.file("known_hosts"))
        let listener = echoListener(QUIC().identity(Identities.server))
        try await withListener(listener, handler: Self.echo) { port in
            let trusts = [
                PeerTrust.pinned(Identities.server.fingerprint).recordingPin(in: file), .knownHosts(file, trustOnFirstUse: false),
            ]
            for (trust, expected) in zip(trusts, [TrustDecision.pinned, .knownHost]) {
                let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                    QUIC().identity(Identities.client).peerTrust(trust)
                }
                try await connection.send(Data("hi".utf8))
                _ = try await connection.receive(exactly: 2)
                #expect(connection.peer?.trust == expected)
                connection.cancel()
            }
            #expect(try file.entries().map(\.fingerprint) == [Identities.server.fingerprint])
        }
    }

    @Test("Framers run unchanged on QUIC")
    func coderOverQUIC() async throws {
        enum Chat: Codable, Sendable, Equatable { case hello(String), bye }
        let listener = NetworkListener(on: 0, host: "127.0.0.1") {
            Coder(Chat.self, using: .json) { QUIC().identity(Identities.server) }
        }
        try await withListener(listener, handler: { connection in
            for try await message in connection.messages { try await connection.send(message) }
        }) { port in
            let chat = NetworkConnection(to: .hostPort(host: "localhost", port: port)) {
                Coder(Chat.self, using: .json) { QUIC().identity(Identities.client).peerFingerprint(Identities.server.fingerprint) }
            }
            try await chat.send(.hello("ada"))
            #expect(try await chat.receive() == .hello("ada"))
            try await chat.send(.bye)
            #expect(try await chat.receive() == .bye)
            chat.cancel()
        }
    }

    @Test("A second QUIC listener on a UDP port in use fails with bind-failed instead of sharing the port")
    func secondListenerOnAPortInUseFails() async throws {
        // With SO_REUSEADDR the second bind succeeded, port 0 could hand out a port in use, and
        // the kernel delivered a client's packets to either listener: in the suite, a test's
        // client was served by another test's listener and its own waited forever.
        let first = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        try await withListener(first, handler: echoUntilFinished) { port in
            let second = NetworkListener(on: port, host: "127.0.0.1") { QUIC().identity(Identities.server) }
            // Bound anyway, it would serve until cancelled: 5 s, then the expectations fail.
            let attempt = Task { await qxferError { try await second.run { _ in } } }
            let limit = Task {
                try? await Task.sleep(for: .seconds(5))
                attempt.cancel()
            }
            let error = await attempt.value
            limit.cancel()
            #expect(error?.code == .bindFailed, "\(String(describing: error))")
            #expect(error?.message.contains("cannot listen on 127.0.0.1 UDP port \(port)") == true, "\(String(describing: error))")
        }
    }

    @Test("QUIC to a UDP port where nothing listens fails at the host's refusal (ICMP port unreachable), not at the handshake timeout")
    func refusedPortFailsAtOnce() async throws {
        let port: UInt16 = 1  // tcpmux: nothing listens there on a test machine
        // The handshake timeout is 10 s; without the refusal the attempt ends there, in
        // "no QUIC answer from the peer (handshake timed out ...)".
        let connection = NetworkConnection(
            to: .hostPort(host: "127.0.0.1", port: port),
            using: .parameters { QUIC().identity(Identities.client) }.connectTimeout(.seconds(600)))
        let error = try #require(await firstAttemptError(of: connection))
        #expect(error.code == .connectFailed)
        #expect(error.message == "cannot connect to 127.0.0.1:1 over UDP: Connection refused", "\(error.message)")
    }
}
