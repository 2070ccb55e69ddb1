import Foundation
import Subprocesses
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What qxfer says and does, held to the truth (issue 62 §3, §4, §9): signals heard while
/// standard input is idle, trust logged only once checked, figures and messages that say what
/// happened. Each runs the real binary, with a real receiver where one is needed.
@Suite("qxfer says what is true")
struct HonestyTests {
    typealias Scratch = CLITests.Scratch

    /// A `qxfer recv --yes --json` on a free loopback port, its identity in `config`.
    final class Receiver: Sendable {
        let process: ChildProcess
        let port: UInt16
        let events: String

        init(home: Scratch, config: String = "recv-config", port wanted: UInt16 = 0, extra: [String] = []) async throws {
            let executable = try #require(CLITests.executable)
            events = home.file("recv-\(config).json")
            process = try ChildProcess(
                executable,
                ["recv", "--no-advertise", "--host", "127.0.0.1", "--port", "\(wanted)", "--dir", home.file("received"), "--yes", "--json",
                 "--config-dir", home.file(config)] + extra,
                environment: HonestyTests.environment(home), stdout: events, stderr: home.file("recv-\(config).err"))
            var found: UInt16?
            let deadline = ContinuousClock.now + .seconds(20)
            while found == nil, ContinuousClock.now < deadline, process.isRunning {
                for line in ((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").split(separator: "\n") {
                    if let event = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                       event["event"] as? String == "listening", let number = event["port"] as? Int {
                        found = UInt16(number)
                    }
                }
                try await Task.sleep(for: .milliseconds(50))
            }
            port = try #require(found, "the receiver did not start listening: \((try? String(contentsOfFile: home.file("recv-\(config).err"), encoding: .utf8)) ?? "")")
        }

        func stop() async { await process.stop() }
    }

    static func environment(_ home: Scratch) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = home.path
        environment["XDG_CONFIG_HOME"] = home.file("xdg")
        return environment
    }

    /// Waits until `path` holds `text` (or `timeout` passes); the file's content.
    static func waitFor(_ text: String, in path: String, timeout: Duration = .seconds(20)) async -> String {
        let deadline = ContinuousClock.now + timeout
        var content = ""
        while ContinuousClock.now < deadline {
            content = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            if content.contains(text) { return content }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return content
    }

    // MARK: §3 Signals while standard input is idle

    @Test("send - with an idle pipe: SIGINT and SIGTERM end it at once, exit 130, 'interrupted'", arguments: [SIGINT, SIGTERM])
    func idleStandardInputHearsSignals(signal: Int32) async throws {
        let home = Scratch()
        let receiver = try await Receiver(home: home)
        defer { Task { await receiver.stop() } }
        // A FIFO held open for writing here, and never written: `sleep 30 | qxfer send -`.
        let fifo = home.file("input")
        #expect(mkfifo(fifo, 0o600) == 0)
        let writer = open(fifo, O_RDWR)
        #expect(writer >= 0)
        defer { close(writer) }
        let executable = try #require(CLITests.executable)
        let sender = try ChildProcess(
            executable, ["send", "-", "--name", "s.bin", "127.0.0.1:\(receiver.port)", "--config-dir", home.file("send-config")],
            environment: Self.environment(home), stdin: fifo, stderr: home.file("send.err"))
        let before = await Self.waitFor("accepted", in: home.file("send.err"))
        #expect(before.contains("accepted"), "the send was not accepted: \(before)")
        try await Task.sleep(for: .milliseconds(300))  // reading the idle pipe by now
        let sent = ContinuousClock.now
        sender.send(signal)
        let ended = await sender.wait(timeout: .seconds(3))
        if !ended { sender.kill() }
        let stderr = (try? String(contentsOfFile: home.file("send.err"), encoding: .utf8)) ?? ""
        #expect(ended, "still running 3 s after the signal; stderr: \(stderr)")
        #expect(ContinuousClock.now - sent < .seconds(3))
        #expect(sender.status == 130, "exit \(String(describing: sender.status)); stderr: \(stderr)")
        #expect(stderr.split(separator: "\n").last?.hasPrefix("qxfer: interrupted") == true, "\(stderr)")
    }

    // MARK: §4 Trust logged only once checked

    @Test("A receiver whose identity changed: -v never says it is trusted before the refusal (77)")
    func trustIsLoggedOnlyOnceChecked() async throws {
        let home = Scratch()
        let file = home.file("a.txt")
        _ = FileManager.default.createFile(atPath: file, contents: Data("hello\n".utf8))
        let executable = try #require(CLITests.executable)
        let sendArguments = ["send", "-v", "--stack", "quic", file, "--config-dir", home.file("send-config")]
        let first = try await Receiver(home: home, config: "identity-one")
        let port = first.port
        // Trusted on first use, with a session ticket kept: the next send sends its offer early.
        let known = try await CLITests.run(executable, sendArguments + ["127.0.0.1:\(port)"], environment: Self.environment(home))
        #expect(known.status == 0, "\(known.stderr)")
        await first.stop()
        try FileManager.default.removeItem(atPath: home.file("received/a.txt"))

        // Another identity on the same port.
        let second = try await Receiver(home: home, config: "identity-two", port: port)
        defer { Task { await second.stop() } }
        let changed = try await CLITests.run(executable, sendArguments + ["127.0.0.1:\(second.port)"], environment: Self.environment(home))
        #expect(changed.status == 77, "\(changed.stderr)")
        #expect(changed.stderr.contains("REFUSED"), "\(changed.stderr)")
        let beforeRefusal = changed.stderr.components(separatedBy: "REFUSED").first ?? ""
        #expect(!beforeRefusal.contains("trusted as"), "trust claimed before the check: \(changed.stderr)")
    }
}
