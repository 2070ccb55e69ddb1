import FoundationEssentials
import Glibc
import Logging
import QXfer
import QXferTransfer
import Synchronization
import PlainText

/// What `send` and `recv` print: a one-line bar on a terminal, periodic plain lines when
/// standard error is not a terminal, or JSON event lines on standard output with `--json`;
/// then a summary. Rates, ETAs and summaries count only the time data moves (``TransferClock``).
final class TransferReporter: Sendable {
    enum Role: Sendable { case sender, receiver }
    enum Style: Sendable { case bar, lines, json }

    let style: Style
    let role: Role
    /// `-q/--quiet`: no bar, no informational lines; warnings, errors, and the summary only
    /// when something was not transferred.
    let quiet: Bool
    /// Names of paired peers, shown beside their fingerprints.
    let pairedNames: [Fingerprint: String]
    private let logger = Logger(label: "qxfer.transfer")
    /// The stack that carries the sender's connection ("QUIC", "TCP+TLS"), once connected.
    private let carrier = Mutex<String?>(nil)
    /// Whether the line for this connection's offer was printed: the same offer made again on
    /// a new connection after early data got no answer is not news; after a reconnect it is.
    private let offerShown = Mutex(false)
    /// The refusals reported in the last seconds (address's host and fingerprint → when).
    private let recentRefusals = Mutex<[String: ContinuousClock.Instant]>([:])
    /// The offer's files of unknown size (standard input, kernel files): the accepted line counts them.
    private let offeredOfUnknownSize = Mutex(0)
    /// For a transfer by code, the path under the connections, read when the summary is made.
    private let path = Mutex<(@Sendable () -> CarriedPath)?>(nil)

    init(json: Bool, role: Role, pairedNames: [Fingerprint: String] = [:], quiet: Bool = false) {
        self.style = json ? .json : (isatty(STDERR_FILENO) == 1 ? .bar : .lines)
        self.role = role
        self.pairedNames = pairedNames
        self.quiet = quiet && !json
    }

    // MARK: Events

    func warn(_ line: String) {
        Console.warn(line)
    }

    /// What a sender found and leaves out, before it connects: each entry a line naming it (its
    /// local path), or with `--json` a `failed` event (its path as the receiver would have named
    /// it, a code and the reason), as for an entry the receiver does not take; the summary counts
    /// them with those.
    func leftOut(_ tree: SourceTree) {
        guard style == .json else {
            for line in tree.skipped { warn(line) }
            return
        }
        for (path, error) in tree.notSent { emit("failed", ["path": path, "code": error.code.name, "message": error.message]) }
        for line in tree.vanished { warn(line) }  // no entries: removed while their folder was read
    }

    /// Names the path a code's transfer took in the summary (`--json`: `path` and its bytes).
    func carried(by path: @escaping @Sendable () -> CarriedPath) {
        self.path.withLock { $0 = path }
    }

    /// A line for `-v`: what the connection did that a person need not see otherwise.
    func info(_ line: String) {
        logger.info("\(line)")
    }

    /// The sender's connection is ready over `stack`: progress and the summary name it.
    func connected(over stack: String?) {
        carrier.withLock { $0 = stack }
        logger.info("connected over \(stack ?? "?")")
    }

    /// One library event: a line (or an event) where a person or a script needs one, a log line at -v.
    func handle(_ event: TransferEvent) {
        switch event {
        case .offered(let entries, let bytes, let sizeUnknown):
            logger.info("offer: \(entries) entries, \(bytes) bytes, \(sizeUnknown) files of unknown size")
            offeredOfUnknownSize.withLock { $0 = sizeUnknown }
            guard !offerShown.withLock({ shown in defer { shown = true }; return shown }) else { break }
            if style == .json { emit("offered", ["entries": entries, "bytes": bytes, "size_unknown": sizeUnknown > 0]) }
            if role == .sender && style != .json && !quiet {
                printLine("offered \(count(entries, "item", "items")) (\(formatSize(bytes, filesOfUnknownSize: sizeUnknown))); waiting for the receiver to accept")
            }
        case .accepted(let bytes, let resumed, let present, let skipped, let holes):
            logger.info("accepted: \(bytes) bytes to move, \(resumed) resumed, \(present) already present, \(skipped) skipped, \(holes) of holes")
            if style == .json {
                var fields: [String: Any] = ["bytes": bytes, "resumed_bytes": resumed, "present": present, "skipped": skipped]
                if role == .sender { fields["hole_bytes"] = holes }
                emit("accepted", fields)
            } else if role == .sender && !quiet {
                // Not "0 B to send" for standard input alone (its size is not known yet), nor
                // when every file is already there (their digests are compared, nothing travels).
                // Not "in full" before the digests say so: a file of the same size and other
                // content is refused then (the summary counts those found whole).
                let unknown = offeredOfUnknownSize.withLock { $0 }
                let amount = unknown > 0 && bytes == 0 ? "sending, size unknown"
                    : bytes == 0 && holes == 0 && present > 0 ? "nothing to send"
                    : "\(formatSize(bytes, filesOfUnknownSize: unknown)) to send"
                printLine("accepted: \(amount)" + (holes > 0 ? " (plus \(TextFormat.bytes(holes)) of holes)" : "")
                          + (resumed > 0 ? ", \(TextFormat.bytes(resumed)) already there" : "")
                          + (present > 0 ? ", \(count(present, "file", "files")) of the same size already there, to compare by digest" : ""))
            }
        case .started(let path, let size, let offset):
            logger.info("file '\(path)': \(size.map { "\($0) bytes" } ?? "size unknown")\(offset > 0 ? ", resuming at byte \(offset)" : "")")
            if style == .json {
                emit("started", ["path": path, "size": size.map { $0 as Any } ?? JSONText.null, "offset": offset])
            } else if offset > 0 && !quiet {
                printLine("resuming '\(path)' from byte \(offset) (already there and checked)")
            }
        case .verified(let path, let size, let digest):
            logger.info("file '\(path)' verified: \(size) bytes, digest \(digest)")
            if style == .json { emit("verified", ["path": path, "size": size, "digest": digest]) }
        case .failed(let path, let error):
            logger.info("file '\(path)' failed: \(error.code.name): \(error.message)")
            if style == .json {
                emit("failed", ["path": path, "code": error.code.name, "message": error.message])
            } else {
                printLine("'\(path)' not transferred: \(error.message)\(overwriteHint(error))")
            }
        case .changed(let path, let sent):
            logger.info("file '\(path)' changed while it was being sent; \(sent) bytes sent as read")
            if style == .json {
                emit("changed", ["path": path, "sent": sent])
            } else {
                printLine("'\(path)' changed while it was being sent: the receiver has the \(TextFormat.bytes(sent)) read then; "
                    + "send it again once it no longer changes")
            }
        }
    }

    func listening(name: String, port: UInt16, addresses: [String], fingerprint: Fingerprint, folder: String) {
        if style == .json {
            emit("listening", ["name": name, "port": port, "addresses": addresses, "fingerprint": fingerprint.description, "folder": folder])
        } else if !quiet {
            let shown = addresses.isEmpty ? "" : " (\(addresses.joined(separator: ", ")))"
            writeOut("receiving into \(folder) as \(name)\(shown) on port \(port), QUIC over UDP and TLS over TCP")
            writeOut("fingerprint \(fingerprint)")
        }
    }

    /// Who sent an offer, as the receiver knows it: the address it came from, its certificate's
    /// fingerprint, and the name it is paired under or known by in `known_hosts`.
    struct Peer: Sendable {
        enum Source: String, Sendable { case paired, knownHosts = "known_hosts", code }
        var address: String?
        var fingerprint: Fingerprint?
        var name: String?
        var nameSource: Source?

        /// "'laptop' (paired) at 192.0.2.7:50123, fingerprint 3f2a1b2c4d5e6f70…", "192.0.2.7:50123,
        /// fingerprint 3f2a1b2c4d5e6f70…"; the address alone when the sender presented no certificate.
        var description: String {
            var parts: [String] = []
            if let name {
                switch nameSource {
                case .paired?: parts.append("'\(name)' (paired)")
                case .code?: parts.append("'\(name)' (knew the code)")
                default: parts.append("'\(name)' (known host)")
                }
                parts.append("at \(address ?? "an unknown address")")
            } else {
                parts.append(address ?? "an unknown address")
            }
            let who = parts.joined(separator: " ")
            guard let fingerprint else { return who + " (no certificate)" }
            return who + ", fingerprint " + Self.short(fingerprint)
        }

        /// The first 16 hex digits: enough to tell senders apart, short enough for a line.
        static func short(_ fingerprint: Fingerprint) -> String {
            String(fingerprint.description.prefix(16)) + "…"
        }
    }

    /// The offer, with who sent it: a line (on the terminal, before a question), or an `offer`
    /// event with `--json`.
    func offer(_ offer: IncomingOffer, from peer: Peer) {
        if style == .json {
            var fields: [String: Any] = [
                "peer_address": peer.address ?? JSONText.null, "fingerprint": peer.fingerprint?.description ?? JSONText.null,
                "entries": offer.entries.count, "files": offer.fileCount,
                "bytes": offer.totalSize, "size_unknown": offer.filesOfUnknownSize > 0,
                "paths": offer.entries.prefix(100).map { $0.path.joined(separator: "/") },
            ]
            if let name = peer.name {
                fields["peer_name"] = name
                fields["peer_name_from"] = peer.nameSource?.rawValue ?? JSONText.null
            }
            emit("offer", fields)
            return
        }
        printLine(offerLine(offer, from: peer))
    }

    /// "offer from 'laptop' (paired) at …, fingerprint …: 1 file, 40.0 MB: one.bin"
    func offerLine(_ offer: IncomingOffer, from peer: Peer) -> String {
        "offer from \(peer.description): \(Self.describe(offer))"
    }

    /// A sender refused during its handshake (`--paired-only`, `--allow`): its address,
    /// fingerprint and why, on a line (a warning) or as a `refused` event.
    func refused(_ client: RefusedClient) {
        // A sender races QUIC and TCP+TLS: one refusal line for both of its attempts.
        let key = "\(client.address?.host ?? "") \(client.fingerprint?.description ?? "")"
        let repeated = recentRefusals.withLock { recent in
            let now = ContinuousClock.now
            recent = recent.filter { now - $0.value < .seconds(2) }
            defer { recent[key] = now }
            return recent[key] != nil
        }
        if repeated { return }
        let name = client.fingerprint.flatMap { pairedNames[$0] }
        if style == .json {
            var fields: [String: Any] = [
                "peer_address": client.address?.description ?? JSONText.null,
                "fingerprint": client.fingerprint?.description ?? JSONText.null, "message": client.reason.message,
            ]
            if let name { fields["peer_name"] = name }
            emit("refused", fields)
            return
        }
        let who = (name.map { "'\($0)' (paired) at " } ?? "") + (client.address?.description ?? "a sender")
        let fingerprint = client.fingerprint.map { ", fingerprint \($0)" } ?? ""
        warn("refused \(who)\(fingerprint): \(client.reason.message)")
    }

    /// "1 file, 2 folders and links, 3.0 MB: a.bin, docs"
    static func describe(_ offer: IncomingOffer) -> String {
        let names = offer.entries.filter { $0.path.count == 1 }.map { $0.path[0] }
        let shownNames = names.prefix(5).joined(separator: ", ") + (names.count > 5 ? ", …" : "")
        let others = offer.entries.count - offer.fileCount
        var parts = [count(offer.fileCount, "file", "files")]
        if others > 0 { parts.append(count(others, "folder or link", "folders and links")) }
        parts.append(formatSize(offer.totalSize, filesOfUnknownSize: offer.filesOfUnknownSize))
        return parts.joined(separator: ", ") + ": " + shownNames
    }

    /// The connection was lost after the receiver accepted; a new one is tried after `delay`.
    func reconnecting(reason: String, after delay: Duration, attempt: Int) {
        offerShown.withLock { $0 = false }
        if style == .json {
            emit("reconnecting", ["reason": reason, "delay_s": delay.seconds, "attempt": attempt])
        } else if !quiet {
            printLine("connection lost (\(reason)); reconnecting in \(TextFormat.fixed(delay.seconds, places: 2)) s to resume (attempt \(attempt))")
        }
    }

    func failed(_ error: any Error, peer: Fingerprint?) {
        let message = Self.message(of: error)
        let sender = peer?.description ?? "unknown sender"
        if style == .json {
            let code = (error as? TransferError)?.code.name ?? (error as? QXferError)?.code.name ?? "error"
            emit("transfer_failed", ["sender": sender, "code": code, "message": message])
        } else {
            printLine("transfer from \(sender) failed: \(message)")
        }
    }

    /// `error`'s one line for a person.
    static func message(of error: any Error) -> String {
        (error as? TransferError)?.message ?? (error as? QXferError)?.message ?? "\(error)"
    }

    // MARK: Progress

    /// Runs `body`, redrawing progress while it runs and `clock` counts; the clock stops (and
    /// adds this connection's bytes) when `body` ends.
    func showProgress<T: Sendable>(
        of progress: TransferProgress, clock: TransferClock, metrics: @escaping @Sendable () async -> ConnectionMetrics,
        _ body: () async throws -> T
    ) async throws -> T {
        let interval: Duration = switch style {
        case .bar: .milliseconds(250)
        case .lines: .seconds(5)
        case .json: .seconds(1)
        }
        let logger = self.logger
        let drawing = Task {
            var lastSample = ContinuousClock.now
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                if Task.isCancelled { break }
                let current = await metrics()
                if logger.logLevel <= .debug, ContinuousClock.now - lastSample >= .seconds(1) {
                    lastSample = ContinuousClock.now
                    logger.debug("path: \(current.description)")
                }
                guard clock.isRunning else { continue }  // nothing moves before the receiver accepts
                draw(progress, metrics: current, moving: clock.elapsed, files: clock.files)
            }
        }
        let outcome: Result<T, any Error>
        do {
            outcome = .success(try await body())
            clock.stop(adding: progress.transferredBytes, holes: progress.zeroBytes, complete: true)
        } catch {
            outcome = .failure(error)
            clock.stop(adding: progress.transferredBytes, holes: progress.zeroBytes, complete: false)
        }
        // Wait for the drawing task to end before clearing the bar: cancelled while it drew
        // (past its checks), it put the bar back after the clear, behind the summary line.
        drawing.cancel()
        await drawing.value
        clearBar()
        return try outcome.get()
    }

    private func draw(_ progress: TransferProgress, metrics: ConnectionMetrics, moving elapsed: Duration, files: TransferClock.Files) {
        if quiet { return }
        let done = Self.bytesArrived(written: progress.transferredBytes, unacknowledged: role == .sender ? metrics.bytesUnacknowledged : nil)
        let total = progress.totalBytes
        // Standard input or a kernel file: the total counts only the files of known size.
        let totalKnown = offeredOfUnknownSize.withLock { $0 } == 0
        let seconds = max(elapsed.seconds, 0.001)
        let rate = Double(done) / seconds
        let rtt = metrics.smoothedRTT.map { TextFormat.fixed($0.seconds * 1000, places: 1) + " ms" }
        let eta: String? = totalKnown && total > done && rate > 0 ? formatDuration(Double(total - done) / rate) : nil
        switch style {
        case .json:
            var object: [String: Any] = ["bytes": done, "total": total, "rate_bytes_per_s": wholeNumber(rate), "seconds": rounded(seconds, places: 3)]
            if let srtt = metrics.smoothedRTT { object["rtt_ms"] = rounded(srtt.seconds * 1000, places: 3) }
            if let stack = metrics.stack { object["stack"] = stack }
            if let file = files.current { object["file"] = file }
            if files.total > 0 {
                object["files_done"] = files.done
                object["files"] = files.total
            }
            emit("progress", object)
        case .lines:
            var line = TextFormat.bytes(done) + (totalKnown ? " of \(TextFormat.bytes(total))" : "") + ", \(formatRate(rate))"
            if let eta { line += ", \(eta) left" }
            if let rtt { line += ", RTT \(rtt)" }
            if files.total > 1 { line += ", \(files.done)/\(files.total) files" }
            printLine(line)
        case .bar:
            Console.drawBar(Self.barLine(
                done: done, total: totalKnown ? total : nil, rate: formatRate(rate), eta: eta, rtt: rtt, columns: Console.terminalColumns,
                file: files.current, files: files.total > 1 ? (files.done, files.total) : nil))
        }
    }

    /// The progress bar's line, fitted to a terminal `columns` wide with one column to spare (a
    /// line that reaches the last column wraps on some terminals, and a wrapped line cannot be
    /// wiped: the bar's first half would stay above the summary). What matters least goes first:
    /// the RTT, the bar's length (down to 10), the bar, the rate, the time left. Without a
    /// `total` (a file of unknown size) there is no bar, share or time left.
    /// After the figures come `files` done of all ("3/10 files", for several) and the `file`
    /// being sent or received, its name shortened from the left to fit (at least 16 columns of
    /// it, else none); where even the count does not fit beside the figures, neither is shown.
    static func barLine(
        done: UInt64, total: UInt64?, rate: String, eta: String?, rtt: String?, columns: Int?,
        file: String? = nil, files: (done: Int, total: Int)? = nil
    ) -> String {
        let limit = max(1, (columns ?? .max) - 1)
        let fraction = total.map { $0 > 0 ? min(1, Double(done) / Double($0)) : 0 } ?? 0
        let percent = total.map { _ in "\(Int(fraction * 100))%" }
        let amount = TextFormat.bytes(done) + (total.map { " / \(TextFormat.bytes($0))" } ?? "")
        func line(bar width: Int, rate showsRate: Bool, eta showsETA: Bool, rtt showsRTT: Bool) -> String {
            var parts: [String] = []
            if let percent {
                if width > 0 {
                    let filled = Int(fraction * Double(width))
                    let bar = String(repeating: "=", count: filled) + (filled < width ? ">" + String(repeating: " ", count: width - filled - 1) : "")
                    parts.append("[\(bar)] " + TextFormat.rightAligned(percent, width: 4))
                } else {
                    parts.append(percent)
                }
            }
            parts.append(amount)
            if showsRate { parts.append(rate) }
            if showsETA, percent != nil, let eta { parts.append("ETA \(eta)") }
            if showsRTT, let rtt { parts.append("RTT \(rtt)") }
            return parts.joined(separator: "  ")
        }
        let shorter = [(bar: 24, rate: true, eta: true, rtt: true)] + (10...24).reversed().map { (bar: $0, rate: true, eta: true, rtt: false) }
            + [(bar: 0, rate: true, eta: true, rtt: false), (bar: 0, rate: false, eta: true, rtt: false), (bar: 0, rate: false, eta: false, rtt: false)]
        let count = files.map { "\(min($0.done, $0.total))/\($0.total) files" }
        /// `text` followed by the count and as much of the file's name as fits (nil: the count does not).
        func withFiles(_ text: String, name: Bool) -> String? {
            var text = text
            if let count {
                guard text.count + 2 + count.count <= limit else { return nil }
                text += "  " + count
            }
            guard name, let file else { return count == nil ? nil : text }
            let room = min(limit - text.count - 2, 40)
            if file.count <= room { return text + "  " + file }
            guard room >= 16 else { return nil }
            return text + "  …" + String(file.suffix(room - 1))
        }
        let lines = shorter.map { line(bar: $0.bar, rate: $0.rate, eta: $0.eta, rtt: $0.rtt) }
        if count != nil || file != nil {
            for name in [true, false] {
                for text in lines { if let full = withFiles(text, name: name) { return full } }
            }
        }
        for text in lines where text.count <= limit { return text }
        return String(line(bar: 0, rate: false, eta: false, rtt: false).prefix(limit))
    }

    /// What a sender shows as done: the file bytes it wrote less what its connection holds
    /// unacknowledged, so that a slow or long path does not show 100 % and "0:01 left" while the
    /// last megabytes are still on their way. (A receiver counts what it received.)
    static func bytesArrived(written: UInt64, unacknowledged: Int?) -> UInt64 {
        written - min(written, UInt64(max(0, unacknowledged ?? 0)))
    }

    // MARK: Summary

    /// The summary of a transfer: bytes moved over every connection it took, in the time they
    /// moved; `reconnects` counts the connections lost and replaced on the way.
    /// `stack` names what carried this transfer where one reporter serves several connections
    /// (a receiver); a sender's comes from ``connected(over:)``.
    /// Below this a rate says more about the start and the last round trip than about the
    /// bytes' speed ("73.5 kB in 0.00 s (387.4 MB/s)"): the summary gives milliseconds and no rate.
    static let shortestRatedTransfer = 0.1

    /// How long a transfer took, for its summary: "1.25 s (45.6 MB/s)"; "4 ms" or "under 1 ms"
    /// below ``shortestRatedTransfer``; no rate when nothing moved (files already there).
    static func timing(bytes: UInt64, seconds: Double) -> String {
        if seconds < shortestRatedTransfer {
            let milliseconds = seconds * 1000
            return milliseconds < 1 ? "under 1 ms" : "\(TextFormat.fixed(milliseconds, places: 0)) ms"
        }
        let time = "\(TextFormat.fixed(seconds, places: 2)) s"
        return bytes > 0 ? time + " (\(formatRate(Double(bytes) / seconds)))" : time
    }

    /// For a file refused because the receiver holds another of its name ("…; not overwriting
    /// it": another size, or the same size and other content), what would replace it.
    private func overwriteHint(_ error: TransferError) -> String {
        guard error.code == .exists, error.message.hasSuffix("not overwriting it") else { return "" }
        return role == .sender ? " (a receiver run with --overwrite replaces it)" : " (run 'qxfer recv --overwrite' to replace it)"
    }

    /// `excluded`: the sender's entries left out by `--exclude` (not failures).
    func finish(_ summary: TransferSummary, clock: TransferClock, reconnects: Int = 0, over stack: String? = nil, excluded: Int = 0) {
        let carrier = stack ?? self.carrier.withLock { $0 }
        let seconds = max(clock.elapsed.seconds, 0.000_001)
        let (bytes, holes) = (clock.bytes, clock.holeBytes)
        let rate = Double(bytes) / seconds
        let checksum = summary.digests.count == 1 ? summary.digests[0].digest : nil
        if style == .json {
            var object: [String: Any] = [
                "succeeded": summary.succeeded, "failed": summary.failures.count,
                "bytes": bytes, "resumed_bytes": summary.resumedBytes, "hole_bytes": holes, "seconds": rounded(seconds, places: 6),
                "rate_bytes_per_s": wholeNumber(rate), "algorithm": summary.algorithm.name, "reconnects": reconnects,
            ]
            if let checksum { object["digest"] = checksum }
            object["present"] = clock.alreadyThere
            if let carrier { object["stack"] = carrier }
            if let path = path.withLock({ $0 })?() {
                object["path"] = path.route
                object["path_direct_bytes"] = path.directBytes
                object["path_relayed_bytes"] = path.relayedBytes
            }
            if summary.senderLeftBeforeComplete { object["sender_left_early"] = true }
            if role == .sender { object["excluded"] = excluded }
            emit("summary", object)
            return
        }
        // Quiet: the summary only when something was not transferred (or a sender left early).
        if quiet && summary.failures.isEmpty && !summary.senderLeftBeforeComplete { return }
        let verb = role == .sender ? "sent" : "received"
        var line = "\(verb) \(TextFormat.bytes(bytes)) in \(Self.timing(bytes: bytes, seconds: seconds))"
        if let carrier { line += " over \(carrier)" }
        if let path = path.withLock({ $0 })?() { line += ", \(path.description)" }
        if summary.resumedBytes > 0 { line += ", \(TextFormat.bytes(summary.resumedBytes)) resumed" }
        if holes > 0 { line += ", plus \(TextFormat.bytes(holes)) of holes" }  // not counted in the rate
        line += "; \(count(summary.digests.count, "file", "files")) verified with \(summary.algorithm.name)"
        if let checksum { line += " \(checksum)" }
        let present = clock.alreadyThere
        if present > 0 { line += summary.digests.count == 1 ? ", already there in full" : ", \(present) of them already there in full" }
        if !summary.failures.isEmpty { line += "; \(summary.failures.count) not transferred" }
        if excluded > 0 { line += "; \(excluded) excluded" }
        if reconnects > 0 { line += "; reconnected \(count(reconnects, "time", "times"))" }
        writeOut(line)
        if summary.senderLeftBeforeComplete {
            warn("the sender went away before it heard that everything arrived: it will say its transfer is unfinished; nothing is missing here")
        }
    }

    // MARK: Output

    private func clearBar() {
        if style == .bar { Console.drawBar("") }
    }

    private func printLine(_ line: String) {
        Console.writeLine("qxfer: \(line)")
    }

    private func emit(_ event: String, _ fields: [String: Any]) {
        Console.emit(event, fields)
    }

    /// Standard output, unbuffered: lines reach a pipe at once. With `recv --stdout` the data
    /// owns standard output, so reports go to standard error.
    private func writeOut(_ line: String) {
        Console.writeLine(line, to: Console.dataOnStandardOutput ? .error : .output)
    }
}

/// The time a transfer's data moves: from the receiver's acceptance to the last file's
/// verdict (or to a connection's failure), summed over reconnects — neither the wait for the
/// answer, nor the closing exchange, nor the backoff before a reconnect counts, as scp and
/// rsync count.
final class TransferClock: Sendable {
    private struct State {
        var earlier: Duration = .zero
        var since: ContinuousClock.Instant?
        var lastVerdict: ContinuousClock.Instant?
        var bytes: UInt64 = 0
        var holeBytes: UInt64 = 0
        /// Files started (sent or received) and not yet verified or failed, by path.
        var started: Set<String> = []
        /// Files verified without having started: found already there in full.
        var alreadyThere = 0
        /// A file in flight (the one that started last, until it ends), the files ended (verified or failed) on this
        /// connection, and the files of the offer.
        var files = Files()
    }

    /// Per-file progress: the file being sent or received, and how many of the offer's are done.
    struct Files: Sendable {
        var current: String?
        var done = 0
        var total = 0
    }

    /// The offer holds `count` files (for "3/10 files").
    func expect(files count: Int) {
        state.withLock { $0.files.total = count }
    }

    /// The file being moved and the count of files done, for the progress line.
    var files: Files { state.withLock { $0.files } }
    private let state = Mutex(State())

    /// A file's data started moving.
    func started(_ path: String) {
        state.withLock {
            _ = $0.started.insert(path)
            $0.files.current = path
        }
    }

    /// A file was verified (`verified`) or failed: one verified with no data moved (a file of
    /// the same size, its digest compared) was already there in full.
    func ended(_ path: String, verified: Bool) {
        state.withLock {
            if $0.started.remove(path) == nil && verified { $0.alreadyThere += 1 }
            $0.files.done += 1
            // The bar names a file still moving (standard input may outlast the files after it).
            if $0.files.current == path { $0.files.current = $0.started.first }
        }
    }

    /// Files found already there in full (their digests compared, no data moved), over every
    /// connection: never also counted in ``bytes``.
    var alreadyThere: Int { state.withLock { $0.alreadyThere } }

    /// The receiver accepted: data starts moving.
    func start() {
        state.withLock { if $0.since == nil { $0.since = .now } }
    }

    /// A file was verified or failed.
    func verdict() {
        state.withLock { $0.lastVerdict = .now }
    }

    /// A connection ended having moved `bytes` and sent `holes` bytes of holes as such:
    /// `complete`, the time ends at the last verdict.
    func stop(adding bytes: UInt64, holes: UInt64, complete: Bool) {
        state.withLock {
            if let since = $0.since {
                let end = complete ? ($0.lastVerdict.map { max($0, since) } ?? .now) : .now
                $0.earlier += end - since
            }
            $0.since = nil
            $0.lastVerdict = nil
            $0.bytes += bytes
            let (sum, overflow) = $0.holeBytes.addingReportingOverflow(holes)  // a peer's claim
            $0.holeBytes = overflow ? .max : sum
        }
    }

    var isRunning: Bool { state.withLock { $0.since != nil } }
    /// Time spent moving data so far.
    var elapsed: Duration { state.withLock { $0.earlier + ($0.since.map { ContinuousClock.now - $0 } ?? .zero) } }
    /// Bytes moved by the connections that ended.
    var bytes: UInt64 { state.withLock { $0.bytes } }
    /// Bytes of holes those connections sent as holes (not in ``bytes``).
    var holeBytes: UInt64 { state.withLock { $0.holeBytes } }

    /// A progress counter feeding this clock and `report`.
    func progress(reporting report: @escaping @Sendable (TransferEvent) -> Void) -> TransferProgress {
        TransferProgress { event in
            switch event {
            // Each connection's offer gets a verdict for every file again (those already there
            // quickly): the count starts over.
            case .offered: self.state.withLock { $0.files.done = 0 }
            case .accepted: self.start()
            case .started(let path, _, _): self.started(path)
            case .verified(let path, _, _):
                self.ended(path, verified: true)
                self.verdict()
            case .failed(let path, _):
                self.ended(path, verified: false)
                self.verdict()
            default: break
            }
            report(event)
        }
    }
}

extension TransferSummary {
    /// What the command ends with when entries were not transferred: each was reported on a line
    /// of its own already, so this line counts them rather than repeat one; the first one's code
    /// gives the exit status.
    var notTransferred: TransferError? {
        guard let first = failures.first else { return nil }
        // A failure without a path had no line of its own (an older receiver's count): said as it is.
        if let unnamed = failures.first(where: { $0.path.isEmpty }) { return unnamed.error }
        let one = failures.count == 1
        return TransferError(
            first.error.code,
            "\(count(failures.count, "item", "items")) named above \(one ? "was" : "were") not transferred"
                + (succeeded > 0 ? "; everything else arrived" : ""))
    }
}

/// "1 file", "2 files".
func count(_ number: Int, _ singular: String, _ plural: String) -> String {
    "\(number) \(number == 1 ? singular : plural)"
}

/// An offer's size: "4.1 kB", "size unknown" (standard input alone), "4.1 kB and 2 files of unknown size".
func formatSize(_ bytes: UInt64, filesOfUnknownSize: Int) -> String {
    if filesOfUnknownSize == 0 { return TextFormat.bytes(bytes) }
    if bytes == 0 { return "size unknown" }
    return "\(TextFormat.bytes(bytes)) and \(count(filesOfUnknownSize, "file", "files")) of unknown size"
}

func formatRate(_ bytesPerSecond: Double) -> String {
    TextFormat.fixed(bytesPerSecond / 1e6, places: 1) + " MB/s"
}

/// `value` rounded to `places` decimals, for JSON: "49.142", not "49.141898000000005".
func rounded(_ value: Double, places: Int) -> Double {
    guard value.isFinite else { return value }
    var scale = 1.0
    for _ in 0..<places { scale *= 10 }
    return (value * scale).rounded() / scale
}

/// A Double as an Int, rounded and clamped: rates and times computed from a peer's sizes may be
/// beyond Int (or not finite), where `Int(_:)` traps.
func wholeNumber(_ value: Double) -> Int {
    guard value.isFinite else { return value > 0 ? .max : 0 }
    return value >= 9.2e18 ? .max : value <= -9.2e18 ? .min : Int(value.rounded())
}

func formatDuration(_ seconds: Double) -> String {
    let total = max(0, wholeNumber(seconds))
    let tail = TextFormat.zeroPadded(total % 60, width: 2)
    return total >= 3600 ? "\(total / 3600):" + TextFormat.zeroPadded(total / 60 % 60, width: 2) + ":" + tail : "\(total / 60):" + tail
}

extension Duration {
    /// The duration in seconds, as a Double.
    var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
