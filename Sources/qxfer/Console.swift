import FoundationEssentials
import Glibc
import Synchronization
import PlainText

/// Where the CLI's messages go: one line on standard error for a person, or with `--json` one
/// JSON object per line on standard output (README.md lists the events), each with an
/// ISO-8601 `time` and a stable `event` name.
enum Console {
    private struct Mode {
        var json = false
        var dataOnStandardOutput = false
    }
    private static let mode = Mutex(Mode())

    /// Whether messages are JSON lines; set once the command line is parsed.
    static var json: Bool {
        get { mode.withLock { $0.json } }
        set { mode.withLock { $0.json = newValue } }
    }

    /// Whether received data goes to standard output (`recv --stdout`): every report then goes
    /// to standard error, JSON lines included.
    static var dataOnStandardOutput: Bool {
        get { mode.withLock { $0.dataOnStandardOutput } }
        set { mode.withLock { $0.dataOnStandardOutput = newValue } }
    }

    /// Writes one JSON event line on standard output (unbuffered: a pipe sees it at once).
    static func emit(_ event: String, _ fields: [String: Any] = [:]) {
        writeEvent(jsonLine(event, fields))
    }

    private static func writeEvent(_ line: String) {
        (dataOnStandardOutput ? StandardStream.error : .output).write(line + "\n")
    }

    /// One event as a JSON line: `event`, `time` and the fields, keys sorted, slashes as they are.
    static func jsonLine(_ event: String, _ fields: [String: Any]) -> String {
        var object = fields
        object["event"] = event
        object["time"] = timestamp()
        return JSONText.object(object)
    }

    /// A warning: `qxfer: …` on standard error, or a `warning` event.
    static func warn(_ line: String) {
        if json {
            emit("warning", ["message": line])
        } else {
            writeLine("qxfer: \(line)")
        }
    }

    /// A fatal error, before the exit: always one line on standard error; with `--json` also an
    /// `error` event carrying the code and the exit status.
    static func fatal(_ message: String, code: String, exitStatus: Int32) {
        if json { emit("error", ["message": message, "code": code, "exit_code": Int(exitStatus)]) }
        StandardStream.error.writeVerbatim("qxfer: \(TerminalText.escaped(message))\n")
    }

    // MARK: The terminal's last line

    /// The question on the terminal, if one is open (recv's "Accept? [y/N] "): no progress bar
    /// is drawn over it, and lines written meanwhile go above it, the question written again
    /// after them. The lock also keeps lines from different tasks whole.
    private static let question = Mutex<String?>(nil)
    private static let standardErrorIsTerminal = isatty(STDERR_FILENO) == 1

    /// Writes one line to `stream`, a newline inside it escaped; on a terminal it starts on a
    /// wiped line (a bar may be there) and goes above an open question.
    static func writeLine(_ line: String, to stream: StandardStream = .error) {
        question.withLock { question in
            let onTerminal = stream.isTerminal
            if onTerminal && standardErrorIsTerminal { StandardStream.error.writeVerbatim(wipeLine) }
            stream.writeVerbatim(TerminalText.escaped(line) + "\n")
            if onTerminal, let question { StandardStream.error.write(question) }
        }
    }

    /// Back to the start of the line, then clear it.
    private static let wipeLine = "\r\u{1B}[K"

    /// The width of the terminal on standard error, in columns; nil when it tells none.
    static var terminalColumns: Int? {
        var size = winsize()
        guard ioctl(STDERR_FILENO, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0 else { return nil }
        return Int(size.ws_col)
    }

    /// Draws `bar` over the current line of standard error (a terminal), unless a question is on it.
    static func drawBar(_ bar: String) {
        question.withLock { question in
            if question == nil { StandardStream.error.writeVerbatim(wipeLine + TerminalText.escaped(bar)) }
        }
    }

    /// Puts `prompt` on the terminal's last line until ``endQuestion(saying:)``.
    static func beginQuestion(_ prompt: String) {
        question.withLock { question in
            question = prompt
            StandardStream.error.writeVerbatim((standardErrorIsTerminal ? wipeLine : "") + TerminalText.escaped(prompt))
        }
    }

    /// Closes the question; `line`, if given, follows on its own line.
    static func endQuestion(saying line: String? = nil) {
        question.withLock { question in
            question = nil
            if let line { StandardStream.error.writeVerbatim("\nqxfer: \(TerminalText.escaped(line))\n") }
        }
    }

    /// Now, in UTC with milliseconds: 2026-11-24T09:30:01.123Z. Formatted by hand: an
    /// `ISO8601DateFormatter` per event loaded ICU's calendar, time-zone and number data into
    /// every `--json` process (6 MiB resident, docs/benchmarks.md) and cost time on each line.
    static func timestamp(_ date: Date = Date()) -> String {
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded())
        let (quotient, remainder) = milliseconds.quotientAndRemainder(dividingBy: 1000)
        var seconds = time_t(remainder < 0 ? quotient - 1 : quotient)
        var parts = tm()
        guard gmtime_r(&seconds, &parts) != nil else { return "" }
        func digits(_ value: Int32, _ width: Int) -> String { TextFormat.zeroPadded(value, width: width) }
        return "\(digits(parts.tm_year + 1900, 4))-\(digits(parts.tm_mon + 1, 2))-\(digits(parts.tm_mday, 2))"
            + "T\(digits(parts.tm_hour, 2)):\(digits(parts.tm_min, 2)):\(digits(parts.tm_sec, 2))"
            + ".\(digits(Int32(milliseconds - Int64(seconds) * 1000), 3))Z"
    }
}
