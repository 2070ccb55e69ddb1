import Foundation
import Subprocesses
import Testing
@testable import QXferStream

/// Streams between two network namespaces joined by the link emulator (50 ms RTT, 1 % loss each
/// way), through the real `qxfer` binary: bench/stream.sh with a short duration. Needs root,
/// /dev/net/tun, ip and jq; the script removes its namespaces and processes whatever happens.
@Suite struct NamespaceStreamTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
    /// The build folder holding this test bundle, where `swift build --build-tests` also put
    /// `qxfer` and `qxfer-linkemu`.
    static let buildFolder = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent().path

    static var canRun: Bool {
        getuid() == 0 && FileManager.default.fileExists(atPath: "/dev/net/tun")
            && FileManager.default.isExecutableFile(atPath: buildFolder + "/qxfer")
            && FileManager.default.isExecutableFile(atPath: buildFolder + "/qxfer-linkemu")
            && ["/usr/bin/jq", "/usr/sbin/ip", "/usr/bin/ip", "/sbin/ip"].contains { FileManager.default.isExecutableFile(atPath: $0) }
            && FileManager.default.isExecutableFile(atPath: "/usr/bin/jq")
    }

    @Test(.enabled(if: canRun, "needs root, /dev/net/tun, ip, jq and the built qxfer and qxfer-linkemu"), .timeLimit(.minutes(3)))
    func everyModeOnBothStacksAcrossTheEmulatedLink() async throws {
        let scratch = try TemporaryDirectory()
        let results = scratch.file("results.jsonl")
        let configs = ["quic:realtime:fec", "quic:realtime:nack", "quic:stream-per-frame:-", "quic:reliable:-", "tls:reliable:-", "tls:realtime:-"]
        var environment = ProcessInfo.processInfo.environment
        environment["QXFER_BIN"] = Self.buildFolder + "/qxfer"
        environment["LINKEMU_BIN"] = Self.buildFolder + "/qxfer-linkemu"
        let run = try await Subprocess.run(
            "/bin/bash", [Self.packageRoot + "/bench/stream.sh", "--duration", "3", "--loss", "1", "--configs", configs.joined(separator: " "),
                          "--prefix", "qxt\(getpid() % 10000)-", "--results", results],
            environment: environment, timeout: .seconds(170))
        let errorText = run.stderr
        #expect(run.status == 0 && !run.timedOut, "bench/stream.sh: \(errorText)")

        let lines = try String(contentsOfFile: results, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == configs.count, "one result per configuration: \(errorText)")
        for line in lines {
            let totals = try #require(StreamTotals.parse(json: Data(line.utf8)))
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            let what = "\(totals.stack) \(object["requested_mode"] ?? "?") \(totals.repair)"
            // 3 s at 30 fps.
            #expect(totals.framesSent >= 88 && totals.framesSent <= 91, "\(what)")
            #expect(totals.framesDelivered + totals.framesLate + totals.framesLost == totals.framesSent, "\(what)")
            // Across namespaces on one host the clocks agree: the estimate must say so.
            #expect(abs(totals.clockOffsetMilliseconds) < 3, "\(what): offset \(totals.clockOffsetMilliseconds) ms")
            // Nothing arrives faster than the link's 25 ms one-way delay.
            #expect(totals.latency.p50 >= 24, "\(what): p50 \(totals.latency.p50) ms")
            // Arrived, on time or late: on-time shares are the benchmark's business (a loaded
            // test machine delays a 3-second stream's first keyframes past their deadline).
            #expect(Double(totals.framesDelivered + totals.framesLate) >= 0.8 * Double(totals.framesSent), "\(what): \(line)")
            if totals.mode == "reliable" { #expect(totals.framesLost == 0, "\(what)") }
            if totals.stack == "tls" && totals.mode != "reliable" { #expect(!totals.note.isEmpty) }
            // At 50 ms RTT the latency modes on QUIC start from a cold window and must have
            // grown it with padding before the first frame; the others send none.
            let warmUp = object["warm_up"] as? [String: Any]
            if totals.stack == "quic" && totals.mode != "reliable" {
                let before = warmUp?["window_before"] as? Int ?? 0, after = warmUp?["window_after"] as? Int ?? 0
                #expect((warmUp?["bytes"] as? Int ?? 0) > 0 && after > before, "\(what): warm-up \(warmUp ?? [:])")
            } else {
                #expect(warmUp == nil, "\(what)")
            }
        }
        // Nothing left behind.
        let namespaces = try String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)
        #expect(!namespaces.contains("qxt\(getpid() % 10000)-"))
    }
}
