import Foundation
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

#if canImport(Glibc)
import Glibc
#endif

/// qxfer's QUIC stack against an independent QUIC implementation: aioquic (PyPI), in both roles.
///
/// The Python helpers live in `Interop/` beside this file. Skipped, with the reason, only when
/// python3 or aioquic cannot be imported (`pip install aioquic`).
@Suite("QUIC interop with aioquic")
struct QUICInteropTests {
    static let python = Subprocess.which("python3")
    static let openssl = Subprocess.which("openssl")
    /// True when `python3 -c "import aioquic"` succeeds (checked once, with a time limit).
    static let aioquicAvailable: Bool = {
        guard let python else { return false }
        let check = try? Subprocess.runBlocking(python, ["-c", "import aioquic.asyncio, aioquic.quic.configuration"], timeout: .seconds(20))
        return check?.status == 0 && check?.timedOut == false
    }()
    static let skipReason: Comment = "python3 with aioquic is not available (pip install aioquic)"

    static func script(_ name: String) -> String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Interop/\(name)").path
    }

    static let echo: @Sendable (NetworkConnection<QUIC>) async throws -> Void = { try await echoUntilFinished($0) }

    /// The JSON line the aioquic client prints.
    struct ClientReport: Decodable {
        var alpn: String?
        var stream_id: Int
        var sent: Int
        var echoed: Int
        var intact: Bool
        var server_fingerprint: String?
    }

    func runAioquicClient(port: UInt16, bytes: Int, extra: [String] = []) async throws -> (Subprocess, ClientReport?) {
        let result = try await Subprocess.run(
            Self.python!, ["-u", Self.script("aioquic_client.py"), "127.0.0.1", "\(port)", "--bytes", "\(bytes)", "--timeout", "15"] + extra,
            timeout: .seconds(100))
        let line = result.stdout.split(separator: "\n").first(where: { $0.hasPrefix("{") })
        let report = line.flatMap { try? JSONDecoder().decode(ClientReport.self, from: Data($0.utf8)) }
        return (result, report)
    }

    // MARK: aioquic client → qxfer listener

    @Test("An aioquic client handshakes with qxfer's QUIC listener, negotiates qxfer/1 and gets stream 0 echoed",
          .enabled(if: aioquicAvailable, skipReason), .timeLimit(.minutes(2)))
    func aioquicClientToListener() async throws {
        let identity = try HostIdentity.ephemeral(commonName: "interop listener")
        let seen = Recorder<PeerIdentity?>()
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(identity) }
        try await withListener(listener, handler: { connection in
            seen.append(connection.peer)
            try await Self.echo(connection)
        }) { port in
            // 300 000 bytes: several flow-control window updates each way, many packets.
            let (result, report) = try await runAioquicClient(port: port, bytes: 300_000)
            #expect(!result.timedOut, "the aioquic client hung: \(result.stderr)")
            #expect(result.status == 0, "aioquic client: \(result.stdout) \(result.stderr)")
            let parsed = try #require(report, "no report from the aioquic client: \(result.stdout) \(result.stderr)")
            #expect(parsed.alpn == "qxfer/1")
            #expect(parsed.stream_id == 0)
            #expect(parsed.echoed == 300_000)
            #expect(parsed.intact)
            #expect(parsed.server_fingerprint.flatMap { Fingerprint(parsing: $0) } == identity.fingerprint)
            #expect(await eventually { seen.count == 1 })
            // The client presented no certificate: the optional request let it in unauthenticated.
            #expect(seen.all.first??.fingerprint == nil)
            #expect(seen.all.first??.applicationProtocol == "qxfer/1")
        }
    }

    @Test("An aioquic client that presents a certificate and finishes the stream is echoed in full",
          .enabled(if: aioquicAvailable && openssl != nil, skipReason), .timeLimit(.minutes(2)))
    func aioquicClientWithCertificateAndFin() async throws {
        let directory = TemporaryDirectory()
        let fingerprint = try await Self.makeCertificate(in: directory)
        let identity = try HostIdentity.ephemeral(commonName: "interop listener")
        let seen = Recorder<PeerIdentity?>()
        let listener = NetworkListener(on: 0, host: "127.0.0.1") {
            QUIC().identity(identity).clientAuthentication(.required(allowing: [fingerprint]))
        }
        try await withListener(listener, handler: { connection in
            seen.append(connection.peer)
            try await Self.echo(connection)
            // Let the client close first, so this test does not depend on how the listener
            // closes when a handler returns (`handlerReturnDeliversEcho` checks that).
            await Self.waitUntilClosed(connection, atMost: .seconds(10))
        }) { port in
            let (result, report) = try await runAioquicClient(
                port: port, bytes: 200_000,
                extra: ["--fin", "--certificate", directory.file("cert.pem"), "--private-key", directory.file("key.pem")])
            #expect(!result.timedOut, "the aioquic client hung: \(result.stderr)")
            #expect(result.status == 0, "aioquic client: \(result.stdout) \(result.stderr)")
            let parsed = try #require(report, "no report from the aioquic client: \(result.stdout) \(result.stderr)")
            #expect(parsed.alpn == "qxfer/1")
            #expect(parsed.echoed == 200_000 && parsed.intact)
            #expect(await eventually { seen.count == 1 })
            #expect(seen.all.first??.fingerprint == fingerprint)
        }
    }

    /// Waits until the peer closes `connection` (or `limit` passes).
    static func waitUntilClosed(_ connection: NetworkConnection<QUIC>, atMost limit: Duration) async {
        let states = connection.states
        _ = try? await within(limit, "the peer's close") {
            for await state in states where state.isFailed || state.isCancelled { return }
        }
    }

    /// `NetworkListener` closes a connection as soon as its handler returns. On QUIC an
    /// immediate CONNECTION_CLOSE would discard stream data the handler already `send`-ed but
    /// the peer has not yet acknowledged (before the graceful close in `QUICConnectionDriver`,
    /// the aioquic client read ~34 KB of 200 KB here). The close must wait for the data, as
    /// closing a TCP socket does.
    @Test("An echo handler that returns on the client's FIN delivers the whole echo",
          .enabled(if: aioquicAvailable, skipReason), .timeLimit(.minutes(2)))
    func handlerReturnDeliversEcho() async throws {
        let identity = try HostIdentity.ephemeral(commonName: "interop listener")
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(identity) }
        try await withListener(listener, handler: Self.echo) { port in
            let (result, report) = try await runAioquicClient(port: port, bytes: 200_000, extra: ["--fin"])
            #expect(!result.timedOut)
            #expect(result.status == 0, "aioquic client: \(result.stdout) \(result.stderr)")
            #expect(report?.echoed == 200_000)
            #expect(report?.intact == true)
        }
    }

    @Test("An aioquic client offering only h3 is refused by qxfer's listener",
          .enabled(if: aioquicAvailable, skipReason), .timeLimit(.minutes(2)))
    func aioquicClientWrongALPN() async throws {
        let identity = try HostIdentity.ephemeral(commonName: "interop listener")
        let seen = Recorder<PeerIdentity?>()
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(identity) }
        try await withListener(listener, handler: { connection in
            seen.append(connection.peer)
            try await Self.echo(connection)
        }) { port in
            let (result, report) = try await runAioquicClient(port: port, bytes: 1000, extra: ["--alpn", "h3", "--timeout", "5"])
            #expect(!result.timedOut)
            #expect(result.status != 0, "the client was echoed with ALPN h3: \(result.stdout)")
            #expect(report == nil)
            #expect(seen.count == 0, "the handler ran for a client without qxfer/1")
        }
    }

    // MARK: qxfer client → aioquic server

    /// A P-256 self-signed certificate from openssl in `directory` (cert.pem, key.pem), and its
    /// fingerprint as openssl computes it.
    static func makeCertificate(in directory: TemporaryDirectory) async throws -> Fingerprint {
        let openssl = try #require(Self.openssl, "openssl is not installed")
        let made = try await Subprocess.run(openssl, [
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=test", "-keyout", directory.file("key.pem"), "-out", directory.file("cert.pem"),
        ])
        try #require(made.status == 0, "openssl req: \(made.stderr)")
        let printed = try await Subprocess.run(openssl, ["x509", "-noout", "-fingerprint", "-sha256", "-in", directory.file("cert.pem")])
        // "sha256 Fingerprint=AB:CD:…"
        let value = try #require(printed.stdout.split(separator: "=").last?.trimmingCharacters(in: .whitespacesAndNewlines))
        return try #require(Fingerprint(parsing: value), "not a fingerprint: \(printed.stdout)")
    }

    @Test("qxfer's QUIC client, pinning an aioquic server's P-256 certificate, gets stream 0 echoed",
          .enabled(if: aioquicAvailable && openssl != nil, skipReason), .timeLimit(.minutes(2)))
    func qxferClientToAioquicServer() async throws {
        let directory = TemporaryDirectory()
        let fingerprint = try await Self.makeCertificate(in: directory)
        let server = try await AioquicServer.start(
            python: Self.python!, script: Self.script("aioquic_server.py"),
            certificate: directory.file("cert.pem"), privateKey: directory.file("key.pem"), log: directory.file("server.out"))
        defer { server.stop() }

        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: server.port)) {
            QUIC().identity(Identities.client).peerFingerprint(fingerprint)
        }
        defer { connection.cancel() }
        let payload = Data((0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 13) })
        let echoed = try await within(.seconds(30), "the echo from aioquic") {
            async let sent: Void = {
                for offset in stride(from: 0, to: payload.count, by: 64 << 10) {
                    try await connection.send(payload[offset..<(offset + (64 << 10))])
                }
                try await connection.finish()
            }()
            let received = try await connection.receive(exactly: payload.count).content
            try await sent
            return received
        }
        #expect(echoed == payload)
        #expect(connection.peer?.trust == .pinned)
        #expect(connection.peer?.fingerprint == fingerprint)
        #expect(connection.peer?.applicationProtocol == "qxfer/1")
        // The server saw the same: qxfer/1 negotiated, and the whole of stream 0 echoed up to its FIN.
        #expect(await eventually(timeout: .seconds(10)) { server.output.contains("ECHOED stream=0 bytes=\(payload.count)") },
                "aioquic server said: \(server.output)")
        #expect(server.output.contains("HANDSHAKE alpn=qxfer/1"))
    }

    @Test("qxfer's QUIC client refuses an aioquic server whose certificate differs from the pin",
          .enabled(if: aioquicAvailable && openssl != nil, skipReason), .timeLimit(.minutes(2)))
    func qxferClientWrongPin() async throws {
        let directory = TemporaryDirectory()
        _ = try await Self.makeCertificate(in: directory)
        let server = try await AioquicServer.start(
            python: Self.python!, script: Self.script("aioquic_server.py"),
            certificate: directory.file("cert.pem"), privateKey: directory.file("key.pem"), log: directory.file("server.out"))
        defer { server.stop() }
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: server.port)) {
            QUIC().identity(Identities.client).peerFingerprint(Identities.stranger.fingerprint)
        }
        defer { connection.cancel() }
        let error = await qxferError {
            try await within(.seconds(30), "the refused connection") { try await connection.send(Data("x".utf8)) }
        }
        #expect(error?.code == .fingerprintMismatch, "\(String(describing: error))")
    }
}

/// The aioquic echo server as a child process: started, asked for its port, killed on `stop()`
/// (and on deinit, so no path leaves it running; it also exits by itself after a minute).
final class AioquicServer: Sendable {
    let process: ChildProcess
    let port: UInt16
    let logPath: String

    private init(process: ChildProcess, port: UInt16, logPath: String) {
        self.process = process
        self.port = port
        self.logPath = logPath
    }

    /// What the server printed so far.
    var output: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    static func start(python: String, script: String, certificate: String, privateKey: String, log: String) async throws -> AioquicServer {
        let process = try ChildProcess(python, ["-u", script, "--certificate", certificate, "--private-key", privateKey, "--lifetime", "60"],
                                       stdout: log, stderr: log)
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            if let line = text.split(separator: "\n").first(where: { $0.hasPrefix("PORT ") }), let port = UInt16(line.dropFirst(5)) {
                return AioquicServer(process: process, port: port, logPath: log)
            }
            if !process.isRunning { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        process.kill()
        throw QXferError(.connectFailed, "the aioquic server did not start: \(text)")
    }

    func stop() { process.kill() }
}
