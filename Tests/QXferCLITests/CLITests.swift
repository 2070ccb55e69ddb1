import Foundation
import Subprocesses
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The `qxfer` executable as a user meets it: help, version, usage errors, and `qxfer id` creating,
/// reusing and refusing to replace an identity. Every run gets its own HOME and XDG_CONFIG_HOME
/// in a temporary folder, so nothing touches the real ~/.config.
@Suite("qxfer command line")
struct CLITests {
    // MARK: Running the binary

    /// The `qxfer` built beside this test bundle (SwiftPM puts every product of a build in one
    /// folder), else the package's default debug build.
    static let executable: String? = {
        var candidates: [String] = []
        let argument0 = URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL
        candidates.append(argument0.deletingLastPathComponent().appendingPathComponent("qxfer").path)
        if let me = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            candidates.append(URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent("qxfer").path)
        }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        candidates.append(root.appendingPathComponent(".build/debug/qxfer").path)
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }()

    struct Run {
        var status: Int32
        var stdout: String
        var stderr: String
        var stderrLines: [Substring] { stderr.split(separator: "\n", omittingEmptySubsequences: false).dropLast() }
    }

    /// A temporary folder removed when the value goes away.
    final class Scratch: Sendable {
        let path: String
        init() {
            let template = FileManager.default.temporaryDirectory.appendingPathComponent("qxfer-cli-XXXXXX").path
            var bytes = Array(template.utf8CString)
            path = bytes.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        }
        deinit { try? FileManager.default.removeItem(atPath: path) }
        func file(_ name: String) -> String { path + "/" + name }
    }

    /// Runs qxfer with `arguments`; HOME and XDG_CONFIG_HOME point into `home` unless overridden.
    static func qxfer(_ arguments: [String], home: Scratch, environment extra: [String: String] = [:]) async throws -> Run {
        let executable = try #require(executable, "the qxfer executable was not found next to the tests")
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = home.path
        environment["XDG_CONFIG_HOME"] = home.file("xdg")
        for (key, value) in extra { environment[key] = value }
        return try await run(executable, arguments, environment: environment)
    }

    /// Runs a program to completion (killed after `timeout`), with output in temporary files.
    static func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                    timeout: Duration = .seconds(30)) async throws -> Run {
        let result = try await Subprocess.run(executable, arguments, environment: environment, timeout: timeout)
        #expect(!result.timedOut, "\(executable) \(arguments) did not finish and was killed")
        return Run(status: result.status, stdout: result.stdout, stderr: result.stderr)
    }

    static func mode(_ path: String) throws -> Int {
        try #require(try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int)
    }

    static func modeIfPresent(_ path: String) -> Int? {
        (try? FileManager.default.attributesOfItem(atPath: path))?[.posixPermissions] as? Int
    }

    static func isFingerprint(_ text: Substring) -> Bool {
        text.count == 64 && text.allSatisfy { "0123456789abcdef".contains($0) }
    }

    // MARK: Help and version

    @Test("The executable is found beside the test bundle")
    func executableFound() throws {
        let path = try #require(Self.executable)
        let argument0 = URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL.deletingLastPathComponent()
        #expect(path.hasPrefix(argument0.path), "found \(path), not beside \(argument0.path)")
    }

    @Test("qxfer --help lists the id subcommand and the exit codes")
    func rootHelp() async throws {
        let home = Scratch()
        let run = try await Self.qxfer(["--help"], home: home)
        #expect(run.status == 0)
        #expect(run.stdout.contains("USAGE: qxfer"))
        #expect(run.stdout.contains("SUBCOMMANDS:"))
        let idLine = run.stdout.split(separator: "\n").first { $0.trimmingCharacters(in: .whitespaces).hasPrefix("id ") }
        #expect(idLine?.contains("fingerprint") == true, "no 'id' line: \(run.stdout)")
        #expect(run.stdout.contains("78 identity"))
        #expect(!FileManager.default.fileExists(atPath: home.file("xdg")), "--help created a configuration folder")
    }

    @Test("qxfer id --help describes the identity and the --json and --config-dir options (no -v: it logs nothing)")
    func idHelp() async throws {
        let run = try await Self.qxfer(["id", "--help"], home: Scratch())
        #expect(run.status == 0)
        #expect(run.stdout.contains("USAGE: qxfer id"))
        #expect(run.stdout.contains("host-key.pem") && run.stdout.contains("host-cert.pem"))
        #expect(run.stdout.contains("SHA-256 fingerprint"))
        for option in ["--json", "--config-dir <dir>"] {
            #expect(run.stdout.contains(option), "\(option) is missing from: \(run.stdout)")
        }
    }

    @Test("send --help names the --checksum default (not the enum's raw value) and says what -v and -vv log")
    func sendHelp() async throws {
        let run = try await Self.qxfer(["send", "--help"], home: Scratch())
        #expect(run.status == 0)
        let help = run.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(help.contains("values: xxh3-128, sha256; default: xxh3-128"), "\(run.stdout)")
        #expect(!help.contains("default: 1)"))
        #expect(help.contains("-vv path samples"))
        #expect(help.contains("values: auto, quic, tls; default: auto)"))
    }

    @Test("recv --help describes --stdout (the pipe that cannot be un-written) and --dir creation")
    func recvHelp() async throws {
        let run = try await Self.qxfer(["recv", "--help"], home: Scratch())
        #expect(run.status == 0)
        let help = run.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(help.contains("--stdout Write the one file of one transfer to standard output"), "\(run.stdout)")
        #expect(help.contains("a pipe cannot be un-written"))
        #expect(help.contains("created if missing"))
        // What the offer prompt discards is in docs/COMMANDS.md now (HelpTests.explanationsMoved).
    }

    @Test("With --json a usage error is also one JSON event on stdout: event, time, code, exit_code")
    func usageErrorAsJSON() async throws {
        let run = try await Self.qxfer(["send", "--json"], home: Scratch())
        #expect(run.status == 64)
        #expect(run.stderrLines.count == 1 && run.stderr.hasPrefix("qxfer: "))
        let lines = run.stdout.split(separator: "\n")
        #expect(lines.count == 1, "stdout: \(run.stdout)")
        let event = try #require(try JSONSerialization.jsonObject(with: Data((lines.first ?? "").utf8)) as? [String: Any])
        #expect(event["event"] as? String == "error")
        #expect(event["code"] as? String == "usage")
        #expect(event["exit_code"] as? Int == 64)
        let time = try #require(event["time"] as? String)
        #expect(time.wholeMatch(of: /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z/) != nil, "time: \(time)")
    }

    @Test("send FILE FILE: the last argument is an existing file, not a host; refused at once (64)")
    func fileWhereTheHostGoes() async throws {
        let home = Scratch()
        _ = FileManager.default.createFile(atPath: home.file("a.bin"), contents: Data([1]))
        _ = FileManager.default.createFile(atPath: home.file("b.bin"), contents: Data([2]))
        let run = try await Self.qxfer(["send", home.file("a.bin"), home.file("b.bin")], home: home)
        #expect(run.status == 64)
        #expect(run.stderr.contains("is a local file, not a host"), "\(run.stderr)")
    }

    @Test("qxfer --version prints a version number")
    func version() async throws {
        let run = try await Self.qxfer(["--version"], home: Scratch())
        #expect(run.status == 0)
        let line = run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(line.wholeMatch(of: /\d+\.\d+\.\d+([-+.][0-9A-Za-z.-]+)?/) != nil, "not a version: \(line)")
    }

    // MARK: Usage errors

    @Test("An unknown option or a bad value exits 64 with exactly one line on stderr", arguments: [
        ["--bogus"], ["id", "--bogus"], ["bogus-command"], ["pair", "--code", "12345"], ["pair", "--code", "abcdef"],
        ["pair", "--name", ""], ["unpair", "nobody"],
    ])
    func usageError(arguments: [String]) async throws {
        let run = try await Self.qxfer(arguments, home: Scratch())
        #expect(run.status == 64)
        #expect(run.stderrLines.count == 1, "stderr: \(run.stderr)")
        #expect(run.stderr.hasPrefix("qxfer: "))
        #expect(run.stdout.isEmpty)
    }

    @Test("A destination that cannot be reached says what is wrong with it, in send, stream send and pair alike (64)", arguments: [
        ("h:0", "'h:0': port 0 is no port to connect to; give the one the receiver listens on"),
        ("[::1]:0", "'[::1]:0': port 0 is no port to connect to; give the one the receiver listens on"),
        ("h:70000", "'h:70000': the port must be a number from 1 to 65535"),
        ("h:", "'h:': the port must be a number from 1 to 65535"),
        ("[]:7447", "'[]:7447' is not a host, host:port or [ipv6]:port"),
    ])
    func destinationRefused(destination: String, message: String) async throws {
        let home = Scratch()
        _ = FileManager.default.createFile(atPath: home.file("a.bin"), contents: Data([1]))
        for arguments in [["send", home.file("a.bin"), destination], ["stream", "send", destination], ["pair", destination, "--code", "123456"]] {
            let run = try await Self.qxfer(arguments, home: home)
            #expect(run.status == 64, "\(arguments)")
            #expect(run.stderr == "qxfer: \(message)\n", "\(arguments)")
        }
    }

    @Test("An argument that is not UTF-8 is refused (64) and named: recv --dir makes no folder of another name, send does not call an existing file missing")
    func argumentNotUTF8() async throws {
        let home = Scratch()
        let executable = try #require(Self.executable)
        // Arguments travel as Swift strings; the shell makes the Latin-1 byte (octal 351, é).
        func qxferThroughShell(_ script: String) async throws -> Run {
            try await Self.run("/bin/sh", ["-c", script, executable, home.path], environment: ["HOME": home.path, "PATH": "/usr/bin:/bin"])
        }
        let recv = try await qxferThroughShell(#"exec "$0" recv --config-dir "$1/cfg" --no-advertise --once --port 0 --dir "$1/$(printf 'dst\351')""#)
        #expect(recv.status == 64)
        #expect(recv.stderrLines == ["qxfer: the argument '\(home.path)/dst\\xe9' is not valid UTF-8, and qxfer takes paths and names in UTF-8 only (a folder so named can be given as '.' from inside it)"], "\(recv.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: home.path).filter { $0.hasPrefix("dst") }.isEmpty)

        let send = try await qxferThroughShell(#"f="$1/$(printf 'caf\351')"; : >"$f"; exec "$0" send --config-dir "$1/cfg" "$f" 127.0.0.1:9"#)
        #expect(send.status == 64)
        #expect(send.stderr.contains("caf\\xe9' is not valid UTF-8"), "\(send.stderr)")
        _ = try await Self.run("/bin/sh", ["-c", #"rm -f "$0/$(printf 'caf\351')""#, home.path])
    }

    // MARK: qxfer id

    @Test("qxfer id creates a private identity, prints its fingerprint, prints the same again, and OpenSSL agrees")
    func idCreatesAndReuses() async throws {
        let home = Scratch()
        let directory = home.file("config/nested")
        let first = try await Self.qxfer(["id", "--config-dir", directory], home: home)
        #expect(first.status == 0, "stderr: \(first.stderr)")
        let fingerprint = Substring(first.stdout.trimmingCharacters(in: .newlines))
        #expect(first.stdout == fingerprint + "\n")
        #expect(Self.isFingerprint(fingerprint), "not 64 hex digits: \(first.stdout)")
        #expect(first.stderr.contains(directory))  // says it created one
        #expect(try Self.mode(directory) == 0o700)
        #expect(try Self.mode(directory + "/host-key.pem") == 0o600)
        #expect(try Self.mode(directory + "/host-cert.pem") == 0o600)
        let key = try Data(contentsOf: URL(fileURLWithPath: directory + "/host-key.pem"))
        #expect(String(decoding: key, as: UTF8.self).contains("PRIVATE KEY"))

        let second = try await Self.qxfer(["id", "--config-dir", directory], home: home)
        #expect(second.status == 0)
        #expect(second.stdout == first.stdout)
        #expect(!second.stderr.contains("created"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: directory + "/host-key.pem")) == key)

        // Nothing went to the default folder.
        #expect(!FileManager.default.fileExists(atPath: home.file("xdg")))
        #expect(!FileManager.default.fileExists(atPath: home.file(".config")))

        if let openssl = ["/usr/bin/openssl", "/usr/local/bin/openssl"].first(where: FileManager.default.isExecutableFile) {
            let printed = try await Self.run(openssl, ["x509", "-in", directory + "/host-cert.pem", "-noout", "-fingerprint", "-sha256"])
            #expect(printed.status == 0)
            let hex = (printed.stdout.split(separator: "=").last ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
                .replacingOccurrences(of: ":", with: "").lowercased()
            #expect(hex == String(fingerprint))
        }
    }

    @Test("qxfer id --json reports fingerprint, directory and whether it was created")
    func idJSON() async throws {
        let home = Scratch()
        let directory = home.file("identity")
        struct Report: Decodable { var fingerprint: String; var directory: String; var created: Bool }
        let first = try await Self.qxfer(["id", "--json", "--config-dir", directory], home: home)
        #expect(first.status == 0)
        let created = try JSONDecoder().decode(Report.self, from: Data(first.stdout.utf8))
        #expect(created.created)
        #expect(created.directory == directory)
        #expect(Self.isFingerprint(Substring(created.fingerprint)))
        let again = try await Self.qxfer(["id", "--json", "--config-dir", directory], home: home)
        let reused = try JSONDecoder().decode(Report.self, from: Data(again.stdout.utf8))
        #expect(!reused.created)
        #expect(reused.fingerprint == created.fingerprint)
        let plain = try await Self.qxfer(["id", "--config-dir", directory], home: home)
        #expect(plain.stdout == created.fingerprint + "\n")
    }

    @Test("Without --config-dir, qxfer id uses $XDG_CONFIG_HOME/qxfer, else ~/.config/qxfer")
    func idDefaultFolder() async throws {
        let home = Scratch()
        let xdg = try await Self.qxfer(["id", "--json"], home: home, environment: ["XDG_CONFIG_HOME": home.file("xdg-here")])
        #expect(xdg.status == 0, "stderr: \(xdg.stderr)")
        #expect(xdg.stdout.contains("\"directory\":\"\(home.file("xdg-here/qxfer"))\"")
            || xdg.stdout.contains("\"directory\":\"\(home.file("xdg-here/qxfer").replacingOccurrences(of: "/", with: "\\/"))\""),
            "\(xdg.stdout)")
        #expect(FileManager.default.fileExists(atPath: home.file("xdg-here/qxfer/host-cert.pem")))

        let fallback = try await Self.qxfer(["id"], home: home, environment: ["XDG_CONFIG_HOME": ""])
        #expect(fallback.status == 0, "stderr: \(fallback.stderr)")
        #expect(FileManager.default.fileExists(atPath: home.file(".config/qxfer/host-cert.pem")))
        #expect(fallback.stdout != xdg.stdout)  // a second, separate identity
    }

    // MARK: A damaged identity is never replaced

    enum Damage: String, CaseIterable, Sendable {
        case garbageCertificate, garbageKey, keyDeleted, certificateDeleted, foreignKey, looseKeyPermissions, looseCertificatePermissions
    }

    @Test("A damaged identity exits 78 with one line on stderr and leaves the files as they were", arguments: Damage.allCases)
    func damagedIdentity(damage: Damage) async throws {
        let home = Scratch()
        let directory = home.file("identity")
        let other = home.file("other")
        #expect(try await Self.qxfer(["id", "--config-dir", directory], home: home).status == 0)
        #expect(try await Self.qxfer(["id", "--config-dir", other], home: home).status == 0)
        let key = directory + "/host-key.pem", certificate = directory + "/host-cert.pem"
        switch damage {
        case .garbageCertificate:
            try Data("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n".utf8).write(to: URL(fileURLWithPath: certificate))
        case .garbageKey:
            try Data("not a key\n".utf8).write(to: URL(fileURLWithPath: key))
        case .keyDeleted:
            try FileManager.default.removeItem(atPath: key)
        case .certificateDeleted:
            try FileManager.default.removeItem(atPath: certificate)
        case .foreignKey:
            try FileManager.default.removeItem(atPath: key)
            try FileManager.default.copyItem(atPath: other + "/host-key.pem", toPath: key)
        case .looseKeyPermissions:
            #expect(chmod(key, 0o644) == 0)
        case .looseCertificatePermissions:
            #expect(chmod(certificate, 0o644) == 0)
        }
        let keyBefore = FileManager.default.contents(atPath: key)
        let certificateBefore = FileManager.default.contents(atPath: certificate)
        let modesBefore = [key, certificate].map(Self.modeIfPresent)

        for arguments in [["id", "--config-dir", directory], ["id", "--json", "--config-dir", directory]] {
            let run = try await Self.qxfer(arguments, home: home)
            #expect(run.status == 78, "\(damage): exit \(run.status), stdout \(run.stdout), stderr \(run.stderr)")
            #expect(run.stderrLines.count == 1, "\(damage): stderr \(run.stderr)")
            #expect(run.stderr.hasPrefix("qxfer: "))
            if arguments.contains("--json") {
                // The same error as one JSON event (and nothing else) on stdout.
                let event = try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any]
                #expect(event?["event"] as? String == "error" && event?["exit_code"] as? Int == 78, "\(damage): stdout \(run.stdout)")
            } else {
                #expect(run.stdout.isEmpty)
            }
        }
        #expect(FileManager.default.contents(atPath: key) == keyBefore, "\(damage): the key was changed")
        #expect(FileManager.default.contents(atPath: certificate) == certificateBefore, "\(damage): the certificate was changed")
        #expect([key, certificate].map(Self.modeIfPresent) == modesBefore)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory).filter { !$0.hasPrefix("host-") }
        #expect(leftovers.isEmpty, "stray files: \(leftovers)")
    }

    // MARK: qxfer pair, devices, unpair

    @Test("qxfer pair without --code and without a terminal refuses to guess; devices lists none, also as JSON")
    func pairingWithoutTerminal() async throws {
        let home = Scratch()
        let pair = try await Self.qxfer(["pair", "127.0.0.1:9"], home: home)
        #expect(pair.status == 64)
        #expect(pair.stderr.contains("pass --code"))
        let devices = try await Self.qxfer(["devices"], home: home)
        #expect(devices.status == 0 && devices.stdout.contains("no paired devices"))
        let json = try await Self.qxfer(["devices", "--json"], home: home)
        #expect(json.status == 0)
        #expect(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [Any] != nil)
    }

    @Test("qxfer --help lists pair, devices and unpair")
    func pairingHelp() async throws {
        let help = try await Self.qxfer(["--help"], home: Scratch())
        for command in ["pair", "devices", "unpair"] { #expect(help.stdout.contains(command)) }
        let pairHelp = try await Self.qxfer(["pair", "--help"], home: Scratch())
        #expect(pairHelp.stdout.contains("SPAKE2") && pairHelp.stdout.contains("--code"))
    }
}
