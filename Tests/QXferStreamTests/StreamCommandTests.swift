import Foundation
import Subprocesses
import Testing
@testable import QXferStream

/// `qxfer stream send` and `qxfer stream recv` as a user runs them: the built binary, real
/// processes, loopback.
@Suite struct StreamCommandTests {
    static let qxfer = NamespaceStreamTests.buildFolder + "/qxfer"
    static var built: Bool { FileManager.default.isExecutableFile(atPath: qxfer) }

    /// Runs qxfer to its end (killed after `limit`); returns status, standard output and error.
    static func run(_ arguments: [String], limit: Duration = .seconds(60)) async throws -> (status: Int32, output: String, errors: String) {
        let result = try await Subprocess.run(qxfer, arguments, timeout: limit)
        return (result.status, result.stdout, result.stderr)
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
        for fps in ["0", "1001", "nan"] {
            let rate = try await Self.run(["stream", "send", "127.0.0.1", "--fps", fps])
            #expect(rate.status == 64 && rate.errors.contains("--fps must be more than 0 and at most 1000"), "\(fps): \(rate.errors)")
        }
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

    /// Reads a named pipe until its writer closes it (or `limit` passes), noting when the first
    /// bytes came. Opened without blocking, so a pipe that nobody ever writes ends the wait.
    static func readPipe(_ path: String, limit: Duration) async -> (bytes: [UInt8], firstAt: ContinuousClock.Instant?) {
        let fd = open(path, O_RDONLY | O_NONBLOCK)
        guard fd >= 0 else { return ([], nil) }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var firstAt: ContinuousClock.Instant?
        let end = ContinuousClock.now + limit
        var buffer = [UInt8](repeating: 0, count: 65536)
        while ContinuousClock.now < end {
            var request = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&request, 1, 0) > 0 else {
                try? await Task.sleep(for: .milliseconds(20))
                continue
            }
            let n = read(fd, &buffer, buffer.count)
            if n > 0 {
                if firstAt == nil { firstAt = .now }
                bytes += buffer[..<n]
            } else if n == 0 || request.revents & Int16(POLLHUP) != 0 {
                if firstAt != nil { break }  // the writer has come and gone
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        return (bytes, firstAt)
    }

    /// `--output` at a named pipe feeds its reader while the stream runs and leaves the pipe a
    /// pipe; at a device (a private /dev/null) it writes into the device and leaves it a device;
    /// at a folder it is refused at once. (It used to write a temporary file and rename it over
    /// whatever the path named: /dev/null became a regular file.)
    @Test(.enabled(if: built, "qxfer is not built"))
    func outputToAPipeOrADeviceIsWrittenNeverReplaced() async throws {
        let scratch = try TemporaryDirectory()
        let identity = try await Self.run(["id", "--config-dir", scratch.file("recv")])
        let fingerprint = identity.output.trimmingCharacters(in: .whitespacesAndNewlines)
        let port = String(24000 + Int(getpid() % 20000))
        func stream(to output: String) async throws -> (received: (status: Int32, output: String, errors: String), senderEnded: ContinuousClock.Instant) {
            async let receiver = Self.run(["stream", "recv", "--port", port, "--output", output, "--config-dir", scratch.file("recv")])
            try await Task.sleep(for: .milliseconds(700))
            let sender = try await Self.run([
                // Reliable: every frame arrives however loaded the machine, so the count is exact.
                "stream", "send", "127.0.0.1:\(port)", "--mode", "reliable", "--duration", "2", "--fingerprint", fingerprint,
                "--config-dir", scratch.file("send"),
            ])
            let senderEnded = ContinuousClock.now
            #expect(sender.status == 0, "sender: \(sender.errors)")
            return (try await receiver, senderEnded)
        }
        func fileType(_ path: String) -> mode_t {
            var info = stat()
            return lstat(path, &info) == 0 ? info.st_mode & S_IFMT : 0
        }

        let fifo = scratch.file("live.fifo")
        #expect(mkfifo(fifo, 0o600) == 0)
        async let piped = Self.readPipe(fifo, limit: .seconds(60))
        let (received, senderEnded) = try await stream(to: fifo)
        let (bytes, firstAt) = await piped
        #expect(received.status == 0, "receiver: \(received.errors)")
        #expect(fileType(fifo) == S_IFIFO, "the pipe was replaced")
        #expect(bytes.starts(with: Array("DKIF".utf8)) && bytes.count > 32 + 60 * 12, "the reader got \(bytes.count) bytes")
        // Live: the reader had the first frames before the sender had sent its last one.
        #expect(firstAt.map { $0 < senderEnded } == true)

        if getuid() == 0 {
            let device = scratch.file("null")
            #expect(mknod(device, S_IFCHR | 0o666, dev_t((1 << 8) | 3)) == 0)
            let (toDevice, _) = try await stream(to: device)
            #expect(toDevice.status == 0, "receiver: \(toDevice.errors)")
            var info = stat()
            #expect(lstat(device, &info) == 0 && info.st_mode & S_IFMT == S_IFCHR && info.st_rdev == dev_t((1 << 8) | 3))
        }

        let refused = try await Self.run(["stream", "recv", "--port", port, "--output", scratch.path, "--config-dir", scratch.file("recv")], limit: .seconds(10))
        #expect(refused.status == 74 && refused.errors.contains("is a folder"), "\(refused.status): \(refused.errors)")
    }
}
