import Foundation
import Subprocesses
import Testing
@testable import qxfer

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
            // Looked at once more after the deadline: beside hundreds of other tests this task
            // may first run again only after it, with the line long written.
            let deadline = ContinuousClock.now + .seconds(30)
            var last = false
            while found == nil, !last {
                last = ContinuousClock.now >= deadline || !process.isRunning
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

    /// A `send -` to `receiver` whose standard input is a FIFO held open for writing here, as
    /// `sleep 30 | qxfer send -` holds it: `initial` (within the pipe's buffer) is all it gets.
    /// Close the returned descriptor at the end.
    static func standardInputSend(home: Scratch, to receiver: Receiver, initial: [UInt8] = []) throws -> (sender: ChildProcess, writer: Int32) {
        let fifo = home.file("input")
        #expect(mkfifo(fifo, 0o600) == 0)
        let writer = open(fifo, O_RDWR)
        #expect(writer >= 0)
        if !initial.isEmpty {
            #expect(initial.withUnsafeBytes { Glibc.write(writer, $0.baseAddress, $0.count) } == initial.count)
        }
        let executable = try #require(CLITests.executable)
        let sender = try ChildProcess(
            executable, ["send", "-", "--name", "s.bin", "127.0.0.1:\(receiver.port)", "--config-dir", home.file("send-config")],
            environment: environment(home), stdin: fifo, stderr: home.file("send.err"))
        return (sender, writer)
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
        while true {
            let late = ContinuousClock.now >= deadline  // the file is read once more after it
            let content = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            if content.contains(text) || late { return content }
            try? await Task.sleep(for: .milliseconds(50))
        }
    }

    // MARK: §3 Signals while standard input is idle

    @Test("send - with an idle pipe: SIGINT and SIGTERM end it at once, exit 130, 'interrupted'", arguments: [SIGINT, SIGTERM])
    func idleStandardInputHearsSignals(signal: Int32) async throws {
        let home = Scratch()
        let receiver = try await Receiver(home: home)
        defer { Task { await receiver.stop() } }
        let (sender, writer) = try Self.standardInputSend(home: home, to: receiver)
        defer { close(writer) }
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

/// §9: the small things a user reads.
extension HonestyTests {
    @Test("A bare 'qxfer' is a usage error: usage on standard error, exit 64")
    func bareCommandIsUsageError() async throws {
        let run = try await CLITests.qxfer([], home: Scratch())
        #expect(run.status == 64)
        #expect(run.stderr.contains("USAGE: qxfer"), "\(run.stderr)")
        #expect(run.stdout.isEmpty)
    }

    @Test("send --bogus names the unknown option, in one line (64)")
    func unknownSendOptionIsNamed() async throws {
        let run = try await CLITests.qxfer(["send", "--bogus"], home: Scratch())
        #expect(run.status == 64)
        #expect(run.stderrLines.count == 1 && run.stderr.contains("'--bogus'"), "\(run.stderr)")
    }

    @Test("qxfer --help lists exit 130 with the others")
    func helpListsInterruptedExit() async throws {
        let run = try await CLITests.qxfer(["--help"], home: Scratch())
        let help = run.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(help.contains("130 interrupted (Ctrl-C or SIGTERM)"), "\(run.stdout)")
    }

    @Test("id, devices and unpair have no -v: not in their help, refused as an option", arguments: [["id"], ["devices"], ["unpair", "x"]])
    func noVerboseWhereNothingIsLogged(command: [String]) async throws {
        let home = Scratch()
        let help = try await CLITests.qxfer([command[0], "--help"], home: home)
        #expect(help.status == 0)
        #expect(!help.stdout.contains("--verbose"), "\(help.stdout)")
        let run = try await CLITests.qxfer(command + ["-v"], home: home)
        #expect(run.status == 64)
        #expect(run.stderr.contains("'-v'"), "\(run.stderr)")
    }

    @Test("recv --help: --overwrite also replaces a same-size file of other content")
    func overwriteHelpSaysSameSize() async throws {
        let run = try await CLITests.qxfer(["recv", "--help"], home: Scratch())
        let help = run.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(help.contains("--overwrite Replace existing files, of another size or of the same size and other content"), "\(run.stdout)")
    }

    @Test("A same-size file of other content is refused with a hint naming --overwrite, on both sides")
    func sameSizeOtherContentNamesOverwrite() async throws {
        let home = Scratch()
        let receiver = try await Receiver(home: home)
        defer { Task { await receiver.stop() } }
        let file = home.file("same.bin")
        try Data(repeating: 1, count: 5000).write(to: URL(fileURLWithPath: file))
        let executable = try #require(CLITests.executable)
        let arguments = ["send", file, "127.0.0.1:\(receiver.port)", "--config-dir", home.file("send-config")]
        let first = try await CLITests.run(executable, arguments, environment: Self.environment(home))
        #expect(first.status == 0, "\(first.stderr)")
        try Data(repeating: 2, count: 5000).write(to: URL(fileURLWithPath: file))
        let second = try await CLITests.run(executable, arguments, environment: Self.environment(home))
        #expect(second.status == 73, "\(second.stderr)")
        #expect(second.stderr.contains("same size but other content; not overwriting it (a receiver run with --overwrite replaces it)"), "\(second.stderr)")
    }

    @Test("The summary gives no rate over a time too short to measure one, and milliseconds instead of '0.00 s'")
    func shortTransferHasNoRate() {
        #expect(TransferReporter.timing(bytes: 73_500, seconds: 0.000_2) == "under 1 ms")
        #expect(TransferReporter.timing(bytes: 73_500, seconds: 0.004_4) == "4 ms")
        #expect(TransferReporter.timing(bytes: 73_500, seconds: 0.099) == "99 ms")
        #expect(TransferReporter.timing(bytes: 2_000_000, seconds: 1.25) == "1.25 s (1.6 MB/s)")
        #expect(TransferReporter.timing(bytes: 0, seconds: 1.25) == "1.25 s")
    }

    @Test("JSON times are rounded: rtt_ms 49.142, not 49.141898000000005")
    func jsonTimesAreRounded() throws {
        #expect(rounded(49.141898000000005, places: 3) == 49.142)
        let line = Console.jsonLine("progress", ["rtt_ms": rounded(49.141898000000005, places: 3)])
        #expect(line.contains("\"rtt_ms\":49.142"), "\(line)")
        #expect(rounded(.infinity, places: 3) == .infinity)
    }
}
