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

/// The TCP+TLS stack against independent TLS implementations: GnuTLS's and OpenSSL's command-line
/// clients against a `NetworkListener`, and a `NetworkConnection` against `openssl s_server`.
/// Skipped (with the reason) when a tool is missing; `make test` installs gnutls-bin and openssl.
@Suite("Interop with GnuTLS and OpenSSL")
struct InteropTests {
    static let gnutls = Subprocess.which("gnutls-cli")
    static let openssl = Subprocess.which("openssl")

    /// The SHA-256 fingerprint OpenSSL computes for the first PEM certificate in `text`.
    static func opensslFingerprint(ofFirstCertificateIn text: String) async throws -> Fingerprint {
        let begin = try #require(text.range(of: "-----BEGIN CERTIFICATE-----"), "no certificate in the output")
        let end = try #require(text.range(of: "-----END CERTIFICATE-----", range: begin.upperBound..<text.endIndex))
        let pem = String(text[begin.lowerBound..<end.upperBound]) + "\n"
        let result = try await Subprocess.run(openssl!, ["x509", "-noout", "-fingerprint", "-sha256"], stdin: Data(pem.utf8))
        #expect(result.status == 0, "openssl x509: \(result.stderr)")
        // "sha256 Fingerprint=AB:CD:…"
        let value = try #require(result.stdout.split(separator: "=").last?.trimmingCharacters(in: .whitespacesAndNewlines))
        return try #require(Fingerprint(parsing: value), "not a fingerprint: \(result.stdout)")
    }

    /// A listener presenting a fresh identity whose handler counts the connections it sees and
    /// answers a line with the line upper-cased, then closes.
    static func withUpperCaseListener(
        tls: (TLS) -> TLS = { $0 }, _ body: @Sendable (UInt16, HostIdentity, Recorder<PeerIdentity?>) async throws -> Void
    ) async throws {
        let identity = try HostIdentity.ephemeral(commonName: "interop listener")
        let seen = Recorder<PeerIdentity?>()
        let configured = tls(TLS().identity(identity))
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { configured }
        try await withListener(listener, handler: { connection in
            seen.append(connection.peer)
            var line = Data()
            while !line.contains(0x0a) {
                line += try await connection.receive(atLeast: 1, atMost: 1024).content
            }
            try await connection.send(Data(String(decoding: line, as: UTF8.self).uppercased().utf8))
        }) { port in
            try await body(port, identity, seen)
        }
    }

    // MARK: Independent clients against NetworkListener

    @Test("gnutls-cli completes a TLS 1.3 handshake with ALPN qxfer/1 and sees the listener's fingerprint",
          .enabled(if: gnutls != nil && openssl != nil, "gnutls-cli or openssl is not installed"))
    func gnutlsClient() async throws {
        try await Self.withUpperCaseListener { port, identity, _ in
            let result = try await Subprocess.run(
                Self.gnutls!, ["--no-ca-verification", "--alpn=qxfer/1", "--print-cert", "-p", "\(port)", "127.0.0.1"],
                stdin: Data())
            let output = result.stdout + result.stderr
            #expect(!result.timedOut)
            #expect(result.status == 0, "gnutls-cli failed: \(output)")
            #expect(output.contains("(TLS1.3-"), "\(output)")
            #expect(output.contains("Application protocol: qxfer/1"), "\(output)")
            #expect(output.contains("Handshake was completed"))
            #expect(try await Self.opensslFingerprint(ofFirstCertificateIn: output) == identity.fingerprint)
        }
    }

    @Test("openssl s_client: TLSv1.3, ALPN qxfer/1, the listener's fingerprint, and a line answered by the handler",
          .enabled(if: openssl != nil, "openssl is not installed"))
    func opensslClient() async throws {
        try await Self.withUpperCaseListener { port, identity, seen in
            let result = try await Subprocess.run(
                Self.openssl!, ["s_client", "-connect", "127.0.0.1:\(port)", "-alpn", "qxfer/1", "-tls1_3", "-showcerts", "-ign_eof"],
                stdin: Data("hello qxfer\n".utf8))
            let output = result.stdout + result.stderr
            #expect(!result.timedOut)
            #expect(output.contains("Protocol  : TLSv1.3") || output.contains("Protocol: TLSv1.3"), "\(output)")
            #expect(output.contains("ALPN protocol: qxfer/1"), "\(output)")
            #expect(result.stdout.contains("HELLO QXFER"), "the handler's reply: \(output)")
            #expect(try await Self.opensslFingerprint(ofFirstCertificateIn: output) == identity.fingerprint)
            #expect(seen.count == 1)
            #expect(seen.all.first??.fingerprint == nil)  // s_client presented no certificate
            #expect(seen.all.first??.applicationProtocol == "qxfer/1")
        }
    }

    @Test("The TLS stack's exporter (RFC 8446 7.5) equals openssl s_client -keymatexport, for SHA-256 and SHA-384 suites",
          .enabled(if: openssl != nil, "openssl is not installed"),
          arguments: ["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"])
    func opensslExporter(cipherSuite: String) async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { TLS().identity(Identities.server) }
        try await withListener(listener, handler: { connection in
            let stream = try #require(connection.currentTransport() as? TLSByteStream)
            let value = try stream.tlsExporter(label: "EXPORTER-qxfer-test", context: [], length: 32)
            try await connection.send(Data(("exported " + value.map { String(format: "%02X", $0) }.joined() + "\n").utf8))
            _ = try? await connection.receive(atLeast: 1, atMost: 1024)
        }) { port in
            let result = try await Subprocess.run(
                Self.openssl!, ["s_client", "-connect", "127.0.0.1:\(port)", "-alpn", "qxfer/1", "-tls1_3", "-ciphersuites", cipherSuite,
                                "-keymatexport", "EXPORTER-qxfer-test", "-keymatexportlen", "32", "-ign_eof"],
                stdin: Data("bye\n".utf8))
            let output = result.stdout + result.stderr
            #expect(!result.timedOut)
            #expect(output.contains(cipherSuite), "\(output)")
            let theirs = output.split(separator: "\n").first { $0.contains("Keying material:") }?
                .split(separator: ":").last?.trimmingCharacters(in: .whitespaces)
            let ours = output.split(separator: "\n").first { $0.hasPrefix("exported ") }?.dropFirst("exported ".count)
            #expect(theirs != nil && theirs?.count == 64, "\(output)")
            #expect(theirs == ours.map(String.init), "\(output)")
        }
    }

    @Test("Mutual TLS with openssl s_client: its certificate on the allow-list is admitted, no certificate is refused",
          .enabled(if: openssl != nil, "openssl is not installed"))
    func opensslMutualTLS() async throws {
        let client = try HostIdentity.ephemeral(commonName: "interop client")
        let directory = TemporaryDirectory()
        #expect(FileManager.default.createFile(
            atPath: directory.file("cert.pem"), contents: Data(client.certificatePEM.utf8), attributes: [.posixPermissions: 0o600]))
        #expect(FileManager.default.createFile(
            atPath: directory.file("key.pem"), contents: Data(client.privateKeyPEM.utf8), attributes: [.posixPermissions: 0o600]))
        try await Self.withUpperCaseListener(tls: { $0.clientAuthentication(.required(allowing: [client.fingerprint])) }) { port, _, seen in
            let anonymous = try await Subprocess.run(
                Self.openssl!, ["s_client", "-connect", "127.0.0.1:\(port)", "-alpn", "qxfer/1", "-ign_eof"],
                stdin: Data("no certificate\n".utf8))
            #expect(!anonymous.stdout.contains("NO CERTIFICATE"))
            let admitted = try await Subprocess.run(
                Self.openssl!, ["s_client", "-connect", "127.0.0.1:\(port)", "-alpn", "qxfer/1", "-ign_eof",
                                "-cert", directory.file("cert.pem"), "-key", directory.file("key.pem")],
                stdin: Data("with certificate\n".utf8))
            #expect(admitted.stdout.contains("WITH CERTIFICATE"), "\(admitted.stdout)\(admitted.stderr)")
            #expect(seen.count == 1)
            #expect(seen.all.first??.trust == .allowListed)
            #expect(seen.all.first??.fingerprint == client.fingerprint)
        }
    }

    @Test("A TLS 1.2-only client and clients offering h2 or no ALPN are refused before the handler sees them",
          .enabled(if: openssl != nil, "openssl is not installed"))
    func refusedClients() async throws {
        try await Self.withUpperCaseListener { port, identity, seen in
            let tls12 = try await Subprocess.run(
                Self.openssl!, ["s_client", "-connect", "127.0.0.1:\(port)", "-alpn", "qxfer/1", "-tls1_2", "-ign_eof"],
                stdin: Data("tls 1.2\n".utf8))
            #expect(!tls12.timedOut)
            #expect(tls12.status != 0, "a TLS 1.2 handshake succeeded: \(tls12.stdout)")
            #expect(!tls12.stdout.contains("TLS 1.2"))

            let h2 = try await Subprocess.run(
                Self.openssl!, ["s_client", "-connect", "127.0.0.1:\(port)", "-alpn", "h2", "-ign_eof"], stdin: Data("h2\n".utf8))
            #expect(!h2.timedOut)
            #expect(!h2.stdout.contains("ALPN protocol:"), "\(h2.stdout)")
            // The handler would answer with the line "H2"; the certificate s_client prints is
            // base64, which may hold those two letters anywhere.
            #expect(!h2.stdout.split(whereSeparator: \.isNewline).contains("H2"), "the handler answered a client offering h2")

            let noALPN = try await Subprocess.run(
                Self.openssl!, ["s_client", "-connect", "127.0.0.1:\(port)", "-ign_eof"], stdin: Data("no alpn\n".utf8))
            #expect(!noALPN.timedOut)
            #expect(!noALPN.stdout.contains("NO ALPN"), "the handler answered a client without ALPN")

            // The listener still serves, and its handler does count: a well-behaved client is seen.
            let good = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                TLS().identity(Identities.client).peerFingerprint(identity.fingerprint)
            }
            defer { good.cancel() }
            try await good.send(Data("good\n".utf8))
            #expect(try await good.receive(exactly: 5).content == Data("GOOD\n".utf8))
            #expect(seen.count == 1, "the handler saw \(seen.count) connections; only the last one was acceptable")
        }
    }

    // MARK: NetworkConnection against openssl s_server

    /// `openssl s_server` on an ephemeral port with a key and certificate OpenSSL generated.
    final class OpenSSLServer: Sendable {
        let process: ChildProcess
        let directory: TemporaryDirectory
        let port: UInt16
        let fingerprint: Fingerprint

        private init(process: ChildProcess, directory: TemporaryDirectory, port: UInt16, fingerprint: Fingerprint) {
            self.process = process
            self.directory = directory
            self.port = port
            self.fingerprint = fingerprint
        }

        static func start(_ extra: [String]) async throws -> OpenSSLServer {
            let openssl = InteropTests.openssl!
            let directory = TemporaryDirectory()
            let generated = try await Subprocess.run(openssl, [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                "-subj", "/CN=openssl interop", "-keyout", directory.file("key.pem"), "-out", directory.file("cert.pem"),
            ])
            #expect(generated.status == 0, "openssl req: \(generated.stderr)")
            let printed = try await Subprocess.run(openssl, ["x509", "-noout", "-fingerprint", "-sha256", "-in", directory.file("cert.pem")])
            let fingerprint = try #require(Fingerprint(parsing: printed.stdout.split(separator: "=").last?
                .trimmingCharacters(in: .whitespacesAndNewlines) ?? ""))

            let path = directory.file("out")
            let process = try ChildProcess(openssl, ["s_server", "-accept", "127.0.0.1:0", "-cert", directory.file("cert.pem"),
                                                     "-key", directory.file("key.pem"), "-rev"] + extra,
                                           stdout: path, stderr: path)
            var found: UInt16?
            _ = await eventually(timeout: .seconds(10)) {
                let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
                guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("ACCEPT") }),
                      let port = line.split(separator: ":").last.flatMap({ UInt16($0) }) else { return false }
                found = port
                return true
            }
            let server = OpenSSLServer(process: process, directory: directory, port: found ?? 0, fingerprint: fingerprint)
            guard found != nil else {
                server.stop()
                throw HangError(what: "openssl s_server reporting its port")
            }
            return server
        }

        func stop() { process.kill() }
    }

    @Test("NetworkConnection to openssl s_server: pinned by OpenSSL's fingerprint, ALPN qxfer/1, data both ways",
          .enabled(if: openssl != nil, "openssl is not installed"))
    func connectionToOpenSSLServer() async throws {
        let server = try await OpenSSLServer.start(["-tls1_3", "-alpn", "qxfer/1"])
        defer { server.stop() }
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: server.port)) {
            TLS().identity(Identities.client).peerFingerprint(server.fingerprint)
        }
        defer { connection.cancel() }
        try await connection.send(Data("hello\n".utf8))
        let reply = try await within(.seconds(10), "s_server's reply") { try await connection.receive(exactly: 6).content }
        #expect(reply == Data("olleh\n".utf8))  // -rev answers each line reversed
        #expect(connection.peer?.applicationProtocol == "qxfer/1")
        #expect(connection.peer?.trust == .pinned)
        #expect(connection.peer?.fingerprint == server.fingerprint)
    }

    @Test("Trust on first use against openssl s_server records the fingerprint OpenSSL computes",
          .enabled(if: openssl != nil, "openssl is not installed"))
    func firstUseOfOpenSSLServer() async throws {
        let server = try await OpenSSLServer.start(["-tls1_3", "-alpn", "qxfer/1"])
        defer { server.stop() }
        let directory = TemporaryDirectory()
        let file = KnownHosts(path: directory.file("known_hosts"))
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: server.port)) {
            TLS().identity(Identities.client).peerTrust(.knownHosts(file))
        }
        defer { connection.cancel() }
        try await connection.start()
        #expect(connection.peer?.trust == .firstUse(recordedIn: file.path))
        #expect(try String(contentsOfFile: file.path, encoding: .utf8) == "127.0.0.1:\(server.port) \(server.fingerprint)\n")
    }

    @Test("A server that does not speak TLS (sshd's banner, a web server's reply) is refused with protocol-mismatch, saying so",
          arguments: ["SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", "HTTP/1.0 400 Bad request\r\n\r\n"])
    func serverWithoutTLS(_ reply: String) async throws {
        let python = try #require(Subprocess.which("python3"))
        let directory = TemporaryDirectory()
        let path = directory.file("out")
        let script = """
            import socket, sys
            s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True)
            while True:
                c, _ = s.accept(); c.sendall(sys.argv[1].encode()); c.recv(4096); c.close()
            """
        let process = try ChildProcess(python, ["-c", script, reply], stdout: path, stderr: directory.file("err"))
        defer { process.kill() }
        var port: UInt16?
        _ = await eventually(timeout: .seconds(10)) {
            port = ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").first.flatMap { UInt16($0) }
            return port != nil
        }
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: try #require(port, "the server's port"))) {
            TLS().identity(Identities.client).peerFingerprint(Identities.client.fingerprint)
        }
        defer { connection.cancel() }
        let error = try await within(.seconds(10), "connecting to a server without TLS") {
            await qxferError { try await connection.start() }
        }
        #expect(error?.code == .protocolMismatch, "\(String(describing: error))")
        #expect(error?.message.contains("does not speak TLS") == true, "\(error?.message ?? "")")
    }

    @Test("A server without ALPN is refused with protocol-mismatch; a TLS 1.2-only server with handshake-failed",
          .enabled(if: openssl != nil, "openssl is not installed"))
    func refusedServers() async throws {
        let noALPN = try await OpenSSLServer.start(["-tls1_3"])
        defer { noALPN.stop() }
        let first = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: noALPN.port)) {
            TLS().identity(Identities.client).peerFingerprint(noALPN.fingerprint)
        }
        let mismatch = try await within(.seconds(10), "connecting to a server without ALPN") {
            await qxferError { try await first.start() }
        }
        #expect(mismatch?.code == .protocolMismatch, "\(String(describing: mismatch))")

        let tls12 = try await OpenSSLServer.start(["-tls1_2", "-alpn", "qxfer/1"])
        defer { tls12.stop() }
        let second = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: tls12.port)) {
            TLS().identity(Identities.client).peerFingerprint(tls12.fingerprint)
        }
        let old = try await within(.seconds(10), "connecting to a TLS 1.2 server") {
            await qxferError { try await second.start() }
        }
        #expect(old?.code == .handshakeFailed, "\(String(describing: old))")
    }
}
