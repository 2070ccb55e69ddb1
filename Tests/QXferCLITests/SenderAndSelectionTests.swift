import Foundation
import Subprocesses
import Testing
@testable import qxfer

#if canImport(Glibc)
import Glibc
#endif

/// Who is sending, as the receiver sees it, and what a send selects (issue 62 §5 and the
/// options it asks for): the offer's address, name and fingerprint; a paired sender admitted as
/// paired; a refused sender logged; `-q`, `--exclude`, `--dry-run`; per-file progress. Each runs
/// the real binary; every line of `--json` output must parse.
@Suite("Who sends, and what is sent")
struct SenderAndSelectionTests {
    typealias Scratch = CLITests.Scratch
    typealias Receiver = HonestyTests.Receiver

    static let events = CountsTests.events
    static let named = CountsTests.named

    /// The fingerprint `qxfer id` prints for the configuration folder `config` of `home`.
    static func fingerprint(_ home: Scratch, config: String) async throws -> String {
        let executable = try #require(CLITests.executable)
        let run = try await CLITests.run(executable, ["id", "--json", "--config-dir", home.file(config)], environment: HonestyTests.environment(home))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any])
        return try #require(object["fingerprint"] as? String)
    }

    /// Waits until the receiver's events hold `count` events named `name`.
    static func receiverEvents(_ receiver: Receiver, named name: String, count: Int = 1) async -> [[String: Any]] {
        let deadline = ContinuousClock.now + .seconds(20)
        while true {
            let late = ContinuousClock.now >= deadline
            let found = named(name, CountsTests.receiverEvents(receiver))
            if found.count >= count || late { return found }
            try? await Task.sleep(for: .milliseconds(50))
        }
    }

    static func file(_ path: String, _ text: String) {
        _ = FileManager.default.createFile(atPath: path, contents: Data(text.utf8))
    }

    // MARK: §5 Who is sending

    @Test("The offer carries the sender's address and fingerprint; its known_hosts name once the receiver knows it")
    func offerNamesTheSender() async throws {
        let home = Scratch()
        let receiver = try await Receiver(home: home)
        defer { Task { await receiver.stop() } }
        Self.file(home.file("a.txt"), "hello\n")
        let first = try await CountsTests.send([home.file("a.txt")], home: home, to: receiver)
        #expect(first.status == 0, "\(first.stderr)")
        let sender = try await Self.fingerprint(home, config: "send-config")
        let offer = try #require(await Self.receiverEvents(receiver, named: "offer").first)
        #expect((offer["peer_address"] as? String)?.hasPrefix("127.0.0.1:") == true, "\(offer)")
        #expect(offer["fingerprint"] as? String == sender, "\(offer)")
        #expect(offer["peer_name"] == nil, "\(offer)")

        // This receiver once sent to that machine under a name: it knows the fingerprint by it.
        let knownHosts = home.file("recv-config/known_hosts")
        Self.file(knownHosts, "laptop.example:7447 \(sender)\n")
        #expect(chmod(knownHosts, 0o600) == 0)
        try FileManager.default.removeItem(atPath: home.file("received/a.txt"))
        let second = try await CountsTests.send([home.file("a.txt")], home: home, to: receiver)
        #expect(second.status == 0, "\(second.stderr)")
        let offers = await Self.receiverEvents(receiver, named: "offer", count: 2)
        let known = try #require(offers.count == 2 ? offers[1] : nil)
        #expect(known["peer_name"] as? String == "laptop.example", "\(known)")
        #expect(known["peer_name_from"] as? String == "known_hosts", "\(known)")
    }

    @Test("A paired sender is named in the offer and admitted as paired (-v), not as unauthenticated")
    func pairedSenderIsNamed() async throws {
        let home = Scratch()
        let executable = try #require(CLITests.executable)
        // Pair the two configuration folders with a code given to both (no terminal needed).
        let port = UInt16.random(in: 30000...60000)
        let waiting = try ChildProcess(
            executable, ["pair", "--host", "127.0.0.1", "--port", "\(port)", "--code", "481516", "--name", "the-receiver",
                         "--config-dir", home.file("recv-config")],
            environment: HonestyTests.environment(home), stdout: home.file("pair-wait.out"), stderr: home.file("pair-wait.err"))
        var joined: CLITests.Run?
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(300))
            let run = try await CLITests.run(
                executable, ["pair", "127.0.0.1:\(port)", "--code", "481516", "--name", "the-sender", "--config-dir", home.file("send-config")],
                environment: HonestyTests.environment(home))
            joined = run
            if run.status == 0 { break }
        }
        #expect(joined?.status == 0, "\(joined?.stderr ?? "")")
        _ = await waiting.wait(timeout: .seconds(10))
        await waiting.stop()

        let receiver = try await Receiver(home: home, extra: ["-v"])
        defer { Task { await receiver.stop() } }
        Self.file(home.file("a.txt"), "hello\n")
        let sent = try await CountsTests.send([home.file("a.txt")], home: home, to: receiver)
        #expect(sent.status == 0, "\(sent.stderr)")
        let offer = try #require(await Self.receiverEvents(receiver, named: "offer").first)
        #expect(offer["peer_name"] as? String == "the-sender", "\(offer)")
        #expect(offer["peer_name_from"] as? String == "paired", "\(offer)")
        let log = (try? String(contentsOfFile: home.file("recv-recv-config.err"), encoding: .utf8)) ?? ""
        #expect(log.contains("admitted as paired device 'the-sender'"), "\(log)")
        #expect(!log.contains("admitted as unauthenticated"), "\(log)")
    }

    @Test("A sender refused by --paired-only or --allow leaves one refused event: address, fingerprint, why", arguments: [
        ["--paired-only"], ["--allow", String(repeating: "ab", count: 32)],
    ])
    func refusedSenderIsLogged(options: [String]) async throws {
        let home = Scratch()
        let receiver = try await Receiver(home: home, extra: options)
        defer { Task { await receiver.stop() } }
        Self.file(home.file("a.txt"), "hello\n")
        let sent = try await CountsTests.send([home.file("a.txt")], home: home, to: receiver)
        #expect(sent.status == 77, "\(sent.stderr)")
        let sender = try await Self.fingerprint(home, config: "send-config")
        let refused = await Self.receiverEvents(receiver, named: "refused")
        try await Task.sleep(for: .milliseconds(500))  // the other stack of the race, had it been counted twice
        #expect(Self.named("refused", CountsTests.receiverEvents(receiver)).count == 1)
        let event = try #require(refused.first)
        #expect((event["peer_address"] as? String)?.hasPrefix("127.0.0.1:") == true, "\(event)")
        #expect(event["fingerprint"] as? String == sender, "\(event)")
        let reason = try #require(event["message"] as? String)
        #expect(reason.contains(options[0] == "--paired-only" ? "paired device" : "allow-list"), "\(reason)")
        #expect(!FileManager.default.fileExists(atPath: home.file("received/a.txt")))
    }

    // MARK: -q/--quiet

    @Test("send -q: nothing on a success; with an entry left out, its line and the summary")
    func quietSend() async throws {
        let home = Scratch()
        let receiver = try await Receiver(home: home)
        defer { Task { await receiver.stop() } }
        try FileManager.default.createDirectory(atPath: home.file("tree"), withIntermediateDirectories: true)
        Self.file(home.file("tree/a.txt"), "a\n")
        let quiet = try await CountsTests.send([home.file("tree"), "-q"], home: home, to: receiver)
        #expect(quiet.status == 0 && quiet.stderr.isEmpty && quiet.stdout.isEmpty, "stdout: \(quiet.stdout) stderr: \(quiet.stderr)")
        #expect(mkfifo(home.file("tree/pipe"), 0o600) == 0)
        let leftOut = try await CountsTests.send([home.file("tree"), "--quiet"], home: home, to: receiver)
        let lines = leftOut.stderr.split(separator: "\n")
        #expect(leftOut.status == 0)
        #expect(lines.count == 1 && lines[0].contains("pipe") && !lines[0].hasPrefix("sent"), "\(leftOut.stderr)")
        #expect(leftOut.stdout.contains("1 not transferred"), "\(leftOut.stdout)")
        let both = try await CountsTests.send([home.file("tree"), "-q", "--json"], home: home, to: receiver)
        #expect(both.status == 64 && both.stderr.contains("--quiet and --json"), "\(both.stderr)")
    }

    @Test("recv -q: no banner, no offer and no summary for a complete transfer")
    func quietReceive() async throws {
        let home = Scratch()
        let executable = try #require(CLITests.executable)
        let port = UInt16.random(in: 30000...60000)
        let receiver = try ChildProcess(
            executable, ["recv", "-q", "--yes", "--once", "--no-advertise", "--host", "127.0.0.1", "--port", "\(port)", "--dir", home.file("received"),
                         "--config-dir", home.file("recv-config")],
            environment: HonestyTests.environment(home), stdout: home.file("recv.out"), stderr: home.file("recv.err"))
        Self.file(home.file("a.txt"), "hello\n")
        var sent: CLITests.Run?
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline, sent?.status != 0 {
            try await Task.sleep(for: .milliseconds(200))
            sent = try await CLITests.run(
                executable, ["send", home.file("a.txt"), "127.0.0.1:\(port)", "--config-dir", home.file("send-config")],
                environment: HonestyTests.environment(home))
        }
        #expect(sent?.status == 0, "\(sent?.stderr ?? "")")
        let ended = await receiver.wait(timeout: .seconds(10))
        if !ended { await receiver.stop() }
        #expect(receiver.status == 0)
        let output = ((try? String(contentsOfFile: home.file("recv.out"), encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: home.file("recv.err"), encoding: .utf8)) ?? "")
        // The folder was created: a warning, which -q keeps.
        #expect(output.split(separator: "\n").allSatisfy { $0.contains("created the folder") }, "\(output)")
        #expect(FileManager.default.fileExists(atPath: home.file("received/a.txt")))
    }

    // MARK: --exclude and --dry-run

    /// tree/ with names --exclude picks from: *.tmp at two depths, build/ folders and a file
    /// named build, raw at the top and deeper, a FIFO.
    static func selectionTree(_ home: Scratch) throws -> String {
        let top = home.file("tree")
        for folder in ["tree/sub/raw", "tree/build", "tree/raw", "tree/sub/deep/build"] {
            try FileManager.default.createDirectory(atPath: home.file(folder), withIntermediateDirectories: true)
        }
        for (path, text) in [
            ("tree/a.tmp", "a"), ("tree/keep.txt", "keep"), ("tree/sub/b.tmp", "b"), ("tree/build/x.o", "x"), ("tree/sub/build", "file"),
            ("tree/raw/r", "r"), ("tree/sub/raw/r2", "r2"), ("tree/sub/deep/build/y.o", "y"),
        ] { Self.file(home.file(path), text) }
        #expect(mkfifo(home.file("tree/pipe"), 0o600) == 0)
        return top
    }

    static let patterns = ["--exclude", "*.tmp", "--exclude", "build/", "--exclude", "/tree/raw", "--exclude", "pipe"]
    static let kept: Set<String> = ["tree", "tree/keep.txt", "tree/sub", "tree/sub/build", "tree/sub/raw", "tree/sub/raw/r2", "tree/sub/deep"]

    @Test("send --dry-run --exclude: an entry event per kept entry, a dry_run total, no connection, exit 0")
    func dryRunWithExclusions() async throws {
        let home = Scratch()
        let top = try Self.selectionTree(home)
        // Port 1 on loopback: nothing listens; a dry run never tries.
        let run = try await CLITests.qxfer(["send", "--dry-run", "--json", top, "127.0.0.1:1"] + Self.patterns, home: home)
        #expect(run.status == 0, "\(run.stderr)")
        let events = Self.events(run.stdout)
        let entries = Self.named("entry", events)
        #expect(Set(entries.compactMap { $0["path"] as? String }) == Self.kept, "\(entries)")
        #expect(Self.named("failed", events).isEmpty, "an excluded FIFO is no failure: \(run.stdout)")
        let total = try #require(Self.named("dry_run", events).first)
        // Excluded: a.tmp, sub/b.tmp, build/, sub/deep/build/, /tree/raw, pipe (sub/build is a file, sub/raw not at the top).
        #expect(CountsTests.int(total["excluded"]) == 6, "\(total)")
        #expect(CountsTests.int(total["files"]) == 3 && CountsTests.int(total["bytes"]) == 10, "\(total)")
        #expect(!FileManager.default.fileExists(atPath: home.file("xdg/qxfer/known_hosts")))

        // Text: a line per entry with its size, then the totals; the host may be left out.
        let text = try await CLITests.qxfer(["send", "--dry-run", top] + Self.patterns, home: home)
        #expect(text.status == 0, "\(text.stderr)")
        let lines = text.stdout.split(separator: "\n")
        #expect(lines.count == Self.kept.count + 1, "\(text.stdout)")
        #expect(lines.contains { $0.hasSuffix("  tree/sub/raw/r2") && $0.contains("2 B") }, "\(text.stdout)")
        #expect(lines.last?.hasPrefix("would offer 3 files (10 B), 4 folders; 6 excluded") == true, "\(text.stdout)")

        // A slash inside matches the end of a path, whole components; ** crosses folders.
        let inner = try await CLITests.qxfer(["send", "--dry-run", "--json", top, "--exclude", "sub/raw", "--exclude", "tree/**/y.o", "--exclude", "ub/build"], home: home)
        let paths = Set(Self.named("entry", Self.events(inner.stdout)).compactMap { $0["path"] as? String })
        #expect(!paths.contains("tree/sub/raw") && !paths.contains("tree/sub/raw/r2") && !paths.contains("tree/sub/deep/build/y.o"), "\(paths)")
        #expect(paths.contains("tree/raw/r") && paths.contains("tree/sub/build") && paths.contains("tree/sub/deep/build"), "\(paths)")
    }

    @Test("send --dry-run: the exit status the left-out entries would give (a name qxfer/1 cannot carry: 77)")
    func dryRunExitStatus() async throws {
        let home = Scratch()
        try FileManager.default.createDirectory(atPath: home.file("tree"), withIntermediateDirectories: true)
        Self.file(home.file("tree/ok.txt"), "ok")
        Self.file(home.file("tree/tab\there"), "t")
        let run = try await CLITests.qxfer(["send", "--dry-run", "--json", home.file("tree")], home: home)
        #expect(run.status == 77, "\(run.stderr)")
        let events = Self.events(run.stdout)
        #expect(Self.named("failed", events).count == 1)
        #expect(CountsTests.int(Self.named("dry_run", events).first?["failed"]) == 1)
        // Excluded, it is no failure.
        let excluded = try await CLITests.qxfer(["send", "--dry-run", home.file("tree"), "--exclude", "tab*"], home: home)
        #expect(excluded.status == 0, "\(excluded.stderr)")
    }

    @Test("send --exclude: excluded entries are not offered, not failures; the summary counts them")
    func excludedAreNotSent() async throws {
        let home = Scratch()
        let top = try Self.selectionTree(home)
        let receiver = try await Receiver(home: home)
        defer { Task { await receiver.stop() } }
        let run = try await CountsTests.send([top, "--json"] + Self.patterns, home: home, to: receiver)
        #expect(run.status == 0, "\(run.stderr)")
        let events = Self.events(run.stdout)
        #expect(Self.named("failed", events).isEmpty, "\(run.stdout)")
        let summary = try #require(Self.named("summary", events).first)
        #expect(CountsTests.int(summary["excluded"]) == 6 && CountsTests.int(summary["failed"]) == 0, "\(summary)")
        let received = home.file("received")
        for path in Self.kept { #expect(FileManager.default.fileExists(atPath: received + "/" + path), "\(path)") }
        for path in ["tree/a.tmp", "tree/sub/b.tmp", "tree/build", "tree/raw", "tree/sub/deep/build", "tree/pipe"] {
            #expect(!FileManager.default.fileExists(atPath: received + "/" + path), "\(path) was sent")
        }
        let bad = try await CLITests.qxfer(["send", top, "127.0.0.1:1", "--exclude", "/"], home: home)
        #expect(bad.status == 64, "\(bad.stderr)")
    }

    // MARK: Per-file progress

    @Test("The bar shows N/M files and the file's name, shortened from the left, and still fits")
    func barShowsFiles() {
        let long = "photos/2026/holiday/" + String(repeating: "x", count: 60) + ".jpg"
        for columns in [40, 80, 120, 200] {
            let line = TransferReporter.barLine(
                done: 10_000_000, total: 40_000_000, rate: "10.0 MB/s", eta: "0:03", rtt: "1.0 ms", columns: columns,
                file: long, files: (3, 10))
            #expect(line.count < columns, "\(columns): \(line)")
            if columns >= 80 {
                #expect(line.contains("3/10 files"), "\(columns): \(line)")
                #expect(line.contains("…") && line.hasSuffix(".jpg"), "\(columns): \(line)")
            }
        }
        let one = TransferReporter.barLine(
            done: 1, total: 2, rate: "1.0 MB/s", eta: nil, rtt: nil, columns: 120, file: "a.bin", files: nil)
        #expect(one.hasSuffix("  a.bin") && !one.contains("files"), "\(one)")
    }
}
