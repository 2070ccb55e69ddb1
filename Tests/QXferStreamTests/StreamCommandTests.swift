import Foundation
import Testing
@testable import QXferStream

/// `qxfer stream send` and `qxfer stream recv` as a user runs them: the built binary, real
/// processes, loopback.
@Suite struct StreamCommandTests {
    static let qxfer = NamespaceStreamTests.buildFolder + "/qxfer"
    static var built: Bool { FileManager.default.isExecutableFile(atPath: qxfer) }

    /// Runs qxfer to its end (killed after `limit`); returns status, standard output and error.
    /// Waits without blocking a thread: the receiver and the sender run at the same time.
    static func run(_ arguments: [String], limit: Duration = .seconds(60)) async throws -> (status: Int32, output: String, errors: String) {
        let scratch = try TemporaryDirectory()
        _ = FileManager.default.createFile(atPath: scratch.file("out"), contents: nil)
        _ = FileManager.default.createFile(atPath: scratch.file("err"), contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: qxfer)
        process.arguments = arguments
        process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: scratch.file("out")))
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: scratch.file("err")))
        process.standardInput = FileHandle.nullDevice
        let exited = AsyncStream<Void>.makeStream()
        process.terminationHandler = { _ in exited.continuation.finish() }
        try process.run()
        let timer = Task {
            try? await Task.sleep(for: limit)
            exited.continuation.finish()
        }
        for await _ in exited.stream {}
        timer.cancel()
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        return (process.terminationStatus,
                try String(contentsOfFile: scratch.file("out"), encoding: .utf8),
                try String(contentsOfFile: scratch.file("err"), encoding: .utf8))
    }

    @Test(.enabled(if: built, "qxfer is not built"))
    func badInputFilesFailWithOneLineAndExitCode65() async throws {
        let scratch = try TemporaryDirectory()
        let cases: [(String, Data, String)] = [
            ("short.ivf", MediaFileTests.ivf(frames: [10]).prefix(20), "truncated IVF header"),
            ("past-end.ivf", MediaFileTests.ivf(frames: [100]).dropLast(1), "claims 100 bytes"),
            ("garbage.y4m", Data("YUV4MPEG2 Wabc H?? Cnope\n".utf8), "bad picture size"),
        ]
        for (name, data, message) in cases {
            try data.write(to: URL(fileURLWithPath: scratch.file(name)))
            // Port 1: the input is read before connecting, so nothing is ever sent.
            let result = try await Self.run(["stream", "send", "127.0.0.1:1", "--input", scratch.file(name), "--config-dir", scratch.file("cfg")])
            #expect(result.status == 65, "\(name): \(result.errors)")
            let lines = result.errors.split(separator: "\n").filter { !$0.contains("created a new identity") }
            #expect(lines.count == 1 && lines[0].hasPrefix("qxfer: ") && lines[0].contains(message), "\(name): \(result.errors)")
        }
        let usage = try await Self.run(["stream", "send", "127.0.0.1", "--bitrate", "fast"])
        #expect(usage.status == 64)
    }

    @Test(.enabled(if: built, "qxfer is not built"), arguments: ["quic", "tls"])
    func sendAndRecvReportInJSON(stack: String) async throws {
        let scratch = try TemporaryDirectory()
        let identity = try await Self.run(["id", "--config-dir", scratch.file("recv")])
        let fingerprint = identity.output.trimmingCharacters(in: .whitespacesAndNewlines)
        let port = String(20000 + Int(getpid() % 20000) + (stack == "tls" ? 1 : 0))
        async let receiver = Self.run(["stream", "recv", "--port", port, "--json", "--config-dir", scratch.file("recv")])
        try await Task.sleep(for: .milliseconds(700))
        let sender = try await Self.run([
            "stream", "send", "127.0.0.1:\(port)", "--stack", stack, "--mode", "realtime", "--duration", "2",
            "--fingerprint", fingerprint, "--config-dir", scratch.file("send"), "--json",
        ])
        let received = try await receiver
        #expect(sender.status == 0, "sender: \(sender.errors)")
        #expect(received.status == 0, "receiver: \(received.errors)")
        let lines = received.output.split(separator: "\n")
        #expect(lines.count >= 2, "one line a second, then the totals: \(received.output)")
        let final = try #require(lines.last.flatMap { StreamTotals.parse(json: Data($0.utf8)) })
        #expect(final.framesSent == 60 && final.framesDelivered + final.framesLate + final.framesLost == 60)
        #expect(final.stack == stack)
        #expect(stack == "quic" ? final.note.isEmpty : final.note.contains("one ordered byte stream"))
        // The sender prints the same totals.
        #expect(sender.output.contains("\"frames_sent\":60"))
    }
}
