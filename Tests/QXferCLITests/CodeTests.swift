import Foundation
import Subprocesses
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `qxfer send --code` and `qxfer recv CODE` through a `qxfer relay`, all on loopback: the real
/// binary, as a user runs it (issue 61). The NAT cases run in network namespaces in
/// Tests/e2e/reach.sh.
@Suite("Transfers by code through a relay")
struct CodeTests {
    typealias Scratch = CLITests.Scratch

    /// A `qxfer relay --port 0 --json` on loopback, and the port it took.
    final class Relay: Sendable {
        let process: ChildProcess
        let port: UInt16

        init(home: Scratch) async throws {
            let executable = try #require(CLITests.executable)
            let events = home.file("relay.json")
            process = try ChildProcess(
                executable, ["relay", "--host", "127.0.0.1", "--port", "0", "--json"],
                environment: HonestyTests.environment(home), stdout: events, stderr: home.file("relay.err"))
            var found: UInt16?
            let deadline = ContinuousClock.now + .seconds(30)
            var last = false
            while found == nil, !last {
                last = ContinuousClock.now >= deadline || !process.isRunning
                for event in CodeTests.events(in: events) where event["event"] as? String == "relay-listening" {
                    found = (event["port"] as? Int).flatMap { UInt16(exactly: $0) }
                }
                try await Task.sleep(for: .milliseconds(50))
            }
            port = try #require(found, "the relay did not start: \((try? String(contentsOfFile: home.file("relay.err"), encoding: .utf8)) ?? "")")
        }
    }

    /// Every JSON line of a file (lines that are not JSON fail the test).
    static func events(in path: String) -> [[String: Any]] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").compactMap { line in
            let event = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            #expect(event != nil, "not a JSON line: \(line)")
            return event
        }
    }

    /// A file of `count` pseudo-random bytes.
    static func makeFile(_ path: String, count: Int) throws {
        var generator = SystemRandomNumberGenerator()
        try Data((0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }).write(to: URL(fileURLWithPath: path))
    }

    /// Runs a sender and a receiver of `code` (`received` as the receiver's code) through the
    /// relay; their exit statuses and the sender's and receiver's JSON events.
    static func transfer(
        home: Scratch, relay: Relay, file: String, code: String = "17-apple-river-stone", received: String? = nil, stack: String = "auto"
    ) async throws -> (sender: Int32?, receiver: Int32?, sent: [[String: Any]], got: [[String: Any]]) {
        let executable = try #require(CLITests.executable)
        let environment = HonestyTests.environment(home)
        let relayAddress = "127.0.0.1:\(relay.port)"
        let sender = try ChildProcess(
            executable,
            ["send", file, "--use-code", code, "--relay", relayAddress, "--stack", stack, "--json", "--config-dir", home.file("send-config")],
            environment: environment, stdout: home.file("send.json"), stderr: home.file("send.err"))
        // The code's room is open once the sender printed its code.
        _ = await HonestyTests.waitFor("\"event\":\"code\"", in: home.file("send.json"))
        let receiver = try ChildProcess(
            executable,
            ["recv", received ?? code, "--relay", relayAddress, "--dir", home.file("received"), "--yes", "--json",
             "--config-dir", home.file("recv-config")],
            environment: environment, stdout: home.file("recv.json"), stderr: home.file("recv.err"))
        _ = await receiver.wait(timeout: .seconds(120))
        _ = await sender.wait(timeout: .seconds(30))
        await receiver.stop()
        await sender.stop()
        return (sender.status, receiver.status, events(in: home.file("send.json")), events(in: home.file("recv.json")))
    }

    static func summary(_ events: [[String: Any]]) -> [String: Any]? {
        events.last { $0["event"] as? String == "summary" }
    }

    @Test("A file sent by code arrives whole; both summaries name the path and agree on the bytes", arguments: ["auto", "quic", "tls"])
    func sendByCode(stack: String) async throws {
        let home = Scratch()
        let relay = try await Relay(home: home)
        defer { relay.process.kill() }
        try FileManager.default.createDirectory(atPath: home.file("received"), withIntermediateDirectories: true)
        try Self.makeFile(home.file("data.bin"), count: 3 << 20)
        let run = try await Self.transfer(home: home, relay: relay, file: home.file("data.bin"), stack: stack)
        let stderr = "\n" + ((try? String(contentsOfFile: home.file("send.err"), encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: home.file("recv.err"), encoding: .utf8)) ?? "")
        #expect(run.sender == 0 && run.receiver == 0, "exit statuses \(String(describing: run.sender)), \(String(describing: run.receiver))\(stderr)")
        #expect(FileManager.default.contentsEqual(atPath: home.file("data.bin"), andPath: home.file("received/data.bin")))
        #expect(run.sent.contains { $0["event"] as? String == "code" && $0["code"] as? String == "17-apple-river-stone" })
        let sent = try #require(Self.summary(run.sent), "no sender summary\(stderr)")
        let got = try #require(Self.summary(run.got), "no receiver summary\(stderr)")
        #expect(sent["bytes"] as? Int == 3 << 20 && got["bytes"] as? Int == 3 << 20)
        // On one host the punches reach each other: the bytes go direct.
        for summary in [sent, got] {
            #expect(["direct", "relayed"].contains(summary["path"] as? String ?? ""))
            let direct = summary["path_direct_bytes"] as? Int ?? 0, relayed = summary["path_relayed_bytes"] as? Int ?? 0
            #expect(direct + relayed >= 3 << 20, "path bytes \(direct) + \(relayed)")
        }
        if stack == "tls" { #expect(sent["stack"] as? String == "TCP+TLS") }
    }

    @Test("A wrong code ends both sides with exit 77 and one sentence; nothing is written")
    func wrongCode() async throws {
        let home = Scratch()
        let relay = try await Relay(home: home)
        defer { relay.process.kill() }
        try FileManager.default.createDirectory(atPath: home.file("received"), withIntermediateDirectories: true)
        try Self.makeFile(home.file("data.bin"), count: 64 << 10)
        let run = try await Self.transfer(home: home, relay: relay, file: home.file("data.bin"), received: "17-apple-river-swan")
        #expect(run.sender == 77 && run.receiver == 77)
        for file in ["send.err", "recv.err"] {
            let text = (try? String(contentsOfFile: home.file(file), encoding: .utf8)) ?? ""
            #expect(text.contains("the code did not match"), "\(file): \(text)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: home.file("received")).isEmpty)
    }

    @Test("A code no sender holds, and a relay that does not answer, each get one clear line and exit 69")
    func nothingThere() async throws {
        let home = Scratch()
        let relay = try await Relay(home: home)
        defer { relay.process.kill() }
        let noSender = try await CLITests.qxfer(
            ["recv", "18-apple-river-stone", "--relay", "127.0.0.1:\(relay.port)", "--dir", home.path, "--yes"], home: home)
        #expect(noSender.status == 69, "\(noSender.stderr)")
        #expect(noSender.stderr.contains("no sender is waiting with this code"), "\(noSender.stderr)")
        // A port nobody listens on: the relay process's port, once it is gone.
        relay.process.kill()
        _ = await relay.process.wait(timeout: .seconds(10))
        try Self.makeFile(home.file("data.bin"), count: 10)
        let noRelay = try await CLITests.qxfer(["send", home.file("data.bin"), "--code", "--relay", "127.0.0.1:\(relay.port)"], home: home)
        #expect(noRelay.status == 69, "\(noRelay.stderr)")
        #expect(noRelay.stderr.split(separator: "\n").count <= 2 && noRelay.stderr.contains("127.0.0.1:\(relay.port)"), "\(noRelay.stderr)")
    }

    @Test("Codes and relays that are not are refused before anything starts (exit 64)", arguments: [
        ["recv", "7-apple-river"], ["recv", "apple-river-stone-7"], ["send", "x", "--use-code", "7-apple"],
        ["send", "x", "--code", "--relay", "host:99999"], ["recv", "--relay", "relay.example"], ["send", "x", "host", "--pair"],
        ["send", "x", "--code", "--to", "office"],
    ])
    func usage(arguments: [String]) async throws {
        let home = Scratch()
        let run = try await CLITests.qxfer(arguments, home: home)
        #expect(run.status == 64, "\(arguments): \(run.stderr)")
    }
}
