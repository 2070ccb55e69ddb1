import Foundation
import Synchronization

/// Where the CLI's messages go: one line on standard error for a person, or with `--json` one
/// JSON object per line on standard output (docs/JSON.md lists the events), each with an
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
        let handle = dataOnStandardOutput ? FileHandle.standardError : FileHandle.standardOutput
        handle.write(Data((jsonLine(event, fields) + "\n").utf8))
    }

    /// One event as a JSON line: `event`, `time` and the fields, keys sorted, slashes as they are.
    static func jsonLine(_ event: String, _ fields: [String: Any]) -> String {
        var object = fields
        object["event"] = event
        object["time"] = timestamp()
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    /// An event from a JSON object line the library printed: its fields, `event` and `time` added.
    static func jsonLine(_ event: String, parsing line: String) -> String {
        let fields = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? ["raw": line]
        return jsonLine(event, fields)
    }

    static func emit(_ event: String, parsing line: String) {
        FileHandle.standardOutput.write(Data((jsonLine(event, parsing: line) + "\n").utf8))
    }

    /// A warning: `qxfer: …` on standard error, or a `warning` event.
    static func warn(_ line: String) {
        if json {
            emit("warning", ["message": line])
        } else {
            FileHandle.standardError.write(Data("qxfer: \(line)\n".utf8))
        }
    }

    /// A fatal error, before the exit: always one line on standard error; with `--json` also an
    /// `error` event carrying the code and the exit status.
    static func fatal(_ message: String, code: String, exitStatus: Int32) {
        if json { emit("error", ["message": message, "code": code, "exit_code": Int(exitStatus)]) }
        FileHandle.standardError.write(Data("qxfer: \(message)\n".utf8))
    }

    /// Now, in UTC with milliseconds: 2026-11-24T09:30:01.123Z.
    static func timestamp(_ date: Date = Date()) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }
}
