import Foundation
import QXfer
import QXferTransfer

/// What `send` and `recv` print: a one-line bar on a terminal, periodic plain lines when
/// standard error is not a terminal, or JSON event lines on standard output with `--json`;
/// then a summary.
final class TransferReporter: Sendable {
    enum Role: Sendable { case sender, receiver }
    enum Style: Sendable { case bar, lines, json }

    let style: Style
    let role: Role
    /// Names of paired peers, shown beside their fingerprints.
    let pairedNames: [Fingerprint: String]

    init(json: Bool, role: Role, pairedNames: [Fingerprint: String] = [:]) {
        self.style = json ? .json : (isatty(STDERR_FILENO) == 1 ? .bar : .lines)
        self.role = role
        self.pairedNames = pairedNames
    }

    // MARK: Events

    func warn(_ line: String) {
        if style == .json {
            emit(["event": "warning", "message": line])
        } else {
            FileHandle.standardError.write(Data("qxfer: \(line)\n".utf8))
        }
    }

    func handle(_ event: TransferEvent) {
        switch (style, event) {
        case (.json, .offered(let entries, let bytes, _)):
            emit(["event": "offered", "entries": entries, "bytes": bytes])
        case (.json, .accepted(let bytes, let resumed, let present, let skipped)):
            emit(["event": "accepted", "bytes": bytes, "resumed_bytes": resumed, "present": present, "skipped": skipped])
        case (.json, .started(let path, let size, let offset)):
            emit(["event": "started", "path": path, "size": size.map { $0 as Any } ?? NSNull(), "offset": offset])
        case (.json, .verified(let path, let size, let digest)):
            emit(["event": "verified", "path": path, "size": size, "digest": digest])
        case (.json, .failed(let path, let error)):
            emit(["event": "failed", "path": path, "code": error.code.name, "message": error.message])
        case (_, .started(let path, _, let offset)) where offset > 0:
            printLine("resuming '\(path)' from byte \(offset) (already there and checked)")
        case (_, .failed(let path, let error)):
            printLine("'\(path)' not transferred: \(error.message)")
        default:
            break
        }
    }

    func listening(name: String, port: UInt16, addresses: [String], fingerprint: Fingerprint, folder: String) {
        if style == .json {
            emit(["event": "listening", "name": name, "port": port, "addresses": addresses, "fingerprint": fingerprint.description, "folder": folder])
        } else {
            let shown = addresses.isEmpty ? "" : " (\(addresses.joined(separator: ", ")))"
            writeOut("receiving into \(folder) as \(name)\(shown) on port \(port), QUIC over UDP and TLS over TCP")
            writeOut("fingerprint \(fingerprint)")
        }
    }

    func offer(_ offer: IncomingOffer) {
        let sender = offer.sender?.description ?? "an unauthenticated sender"
        let paired = offer.sender.flatMap { pairedNames[$0] }
        if style == .json {
            emit([
                "event": "offer", "sender": sender, "paired_name": paired ?? NSNull(), "entries": offer.entries.count, "files": offer.fileCount,
                "bytes": offer.totalSize, "size_unknown": offer.hasSizeUnknown,
                "paths": offer.entries.prefix(100).map { $0.path.joined(separator: "/") },
            ])
            return
        }
        let names = offer.entries.filter { $0.path.count == 1 }.map { $0.path[0] }
        let shownNames = names.prefix(5).joined(separator: ", ") + (names.count > 5 ? ", …" : "")
        let size = formatBytes(offer.totalSize) + (offer.hasSizeUnknown ? " and a stream" : "")
        let from = paired.map { "'\($0)' (paired, \(sender))" } ?? sender
        printLine("offer from \(from): \(offer.fileCount) files, \(offer.entries.count - offer.fileCount) folders and links, \(size): \(shownNames)")
    }

    /// The connection was lost after the receiver accepted; a new one is tried after `delay`.
    func reconnecting(reason: String, after delay: Duration, attempt: Int) {
        if style == .json {
            emit(["event": "reconnecting", "reason": reason, "delay_s": delay.seconds, "attempt": attempt])
        } else {
            printLine("connection lost (\(reason)); reconnecting in \(String(format: "%.2f", delay.seconds)) s to resume (attempt \(attempt))")
        }
    }

    func failed(_ error: any Error, peer: Fingerprint?) {
        let message = (error as? TransferError)?.message ?? (error as? QXferError)?.message ?? "\(error)"
        warn("transfer from \(peer?.description ?? "unknown sender") failed: \(message)")
    }

    // MARK: Progress

    /// Runs `body`, redrawing progress while it runs; returns its result and how long it took.
    func showProgress<T: Sendable>(
        of progress: TransferProgress, metrics: @escaping @Sendable () async -> ConnectionMetrics,
        _ body: () async throws -> T
    ) async throws -> (result: T, elapsed: Duration) {
        let started = ContinuousClock.now
        let interval: Duration = switch style {
        case .bar: .milliseconds(250)
        case .lines: .seconds(5)
        case .json: .seconds(1)
        }
        let drawing = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                if Task.isCancelled { break }
                draw(progress, metrics: await metrics(), elapsed: ContinuousClock.now - started)
            }
        }
        defer {
            drawing.cancel()
            if style == .bar { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
        }
        let result = try await body()
        return (result, ContinuousClock.now - started)
    }

    private func draw(_ progress: TransferProgress, metrics: ConnectionMetrics, elapsed: Duration) {
        let done = progress.transferredBytes
        let total = progress.totalBytes
        let seconds = max(elapsed.seconds, 0.001)
        let rate = Double(done) / seconds
        let rtt = metrics.smoothedRTT.map { String(format: "%.1f ms", $0.seconds * 1000) }
        let eta: String? = total > done && rate > 0 ? formatDuration(Double(total - done) / rate) : nil
        switch style {
        case .json:
            var object: [String: Any] = ["event": "progress", "bytes": done, "total": total, "rate_bytes_per_s": wholeNumber(rate)]
            if let srtt = metrics.smoothedRTT { object["rtt_ms"] = srtt.seconds * 1000 }
            emit(object)
        case .lines:
            var line = "\(formatBytes(done)) of \(formatBytes(total)), \(formatRate(rate))"
            if let eta { line += ", \(eta) left" }
            if let rtt { line += ", RTT \(rtt)" }
            printLine(line)
        case .bar:
            let fraction = total > 0 ? min(1, Double(done) / Double(total)) : 0
            let width = 24
            let filled = Int(fraction * Double(width))
            let bar = String(repeating: "=", count: filled) + (filled < width ? ">" + String(repeating: " ", count: width - filled - 1) : "")
            var line = String(format: "[%@] %3d%%  %@ / %@  %@", bar, Int(fraction * 100), formatBytes(done), formatBytes(total), formatRate(rate))
            if let eta { line += "  ETA \(eta)" }
            if let rtt { line += "  RTT \(rtt)" }
            FileHandle.standardError.write(Data("\r\u{1B}[K\(line)".utf8))
        }
    }

    // MARK: Summary

    /// The summary; `reconnects` counts the connections lost and replaced on the way (the
    /// figures are those of the last connection).
    func finish(_ outcome: (result: TransferSummary, elapsed: Duration), reconnects: Int = 0) {
        let summary = outcome.result
        let seconds = max(outcome.elapsed.seconds, 0.000_001)
        let rate = Double(summary.transferredBytes) / seconds
        let checksum = summary.digests.count == 1 ? summary.digests[0].digest : nil
        if style == .json {
            var object: [String: Any] = [
                "event": "summary", "succeeded": summary.succeeded, "failed": summary.failures.count,
                "bytes": summary.transferredBytes, "resumed_bytes": summary.resumedBytes, "seconds": seconds,
                "rate_bytes_per_s": wholeNumber(rate), "algorithm": summary.algorithm.name, "reconnects": reconnects,
            ]
            if let checksum { object["digest"] = checksum }
            emit(object)
            return
        }
        let verb = role == .sender ? "sent" : "received"
        var line = "\(verb) \(formatBytes(summary.transferredBytes)) in \(String(format: "%.2f", seconds)) s (\(formatRate(rate)))"
        if summary.resumedBytes > 0 { line += ", \(formatBytes(summary.resumedBytes)) resumed" }
        let files = summary.digests.count
        line += "; \(files) file\(files == 1 ? "" : "s") verified with \(summary.algorithm.name)"
        if let checksum { line += " \(checksum)" }
        if !summary.failures.isEmpty { line += "; \(summary.failures.count) not transferred" }
        if reconnects > 0 { line += "; reconnected \(reconnects) time\(reconnects == 1 ? "" : "s")" }
        writeOut(line)
    }

    // MARK: Output

    private func printLine(_ line: String) {
        if style == .bar { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
        FileHandle.standardError.write(Data("qxfer: \(line)\n".utf8))
    }

    private func emit(_ object: [String: Any]) {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return }
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }

    /// Standard output, unbuffered: lines reach a pipe at once.
    private func writeOut(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }
}

func formatBytes(_ bytes: UInt64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(bytes)
    var unit = 0
    while value >= 1024 && unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return unit == 0 ? "\(bytes) B" : String(format: "%.1f %@", value, units[unit])
}

func formatRate(_ bytesPerSecond: Double) -> String {
    String(format: "%.1f MB/s", bytesPerSecond / 1e6)
}

/// A Double as an Int, rounded and clamped: rates and times computed from a peer's sizes may be
/// beyond Int (or not finite), where `Int(_:)` traps.
func wholeNumber(_ value: Double) -> Int {
    guard value.isFinite else { return value > 0 ? .max : 0 }
    return value >= 9.2e18 ? .max : value <= -9.2e18 ? .min : Int(value.rounded())
}

func formatDuration(_ seconds: Double) -> String {
    let total = max(0, wholeNumber(seconds))
    let tail = String(format: "%02d", total % 60)  // %d is 32 bits: only for numbers below 60
    return total >= 3600 ? "\(total / 3600):" + String(format: "%02d", total / 60 % 60) + ":" + tail : "\(total / 60):" + tail
}

extension Duration {
    /// The duration in seconds, as a Double.
    var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
