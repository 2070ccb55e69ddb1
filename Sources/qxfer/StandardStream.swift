import Glibc
import PlainText
import SafeOutput

/// Standard output or standard error, written with write(2): whole, unbuffered (a pipe sees
/// each line at once), retried when interrupted; a closed reader or a full disk loses the text
/// quietly, as a report cannot be reported anywhere else.
enum StandardStream: Int32 {
    case output = 1
    case error = 2

    /// Whether the stream is a terminal.
    var isTerminal: Bool { isatty(rawValue) == 1 }

    /// Writes `text` with its control characters escaped but newlines (``TerminalText``): a
    /// name or a peer's words cannot drive the terminal.
    func write(_ text: String) {
        writeVerbatim(TerminalText.escaped(text, keepingNewlines: true))
    }

    /// Writes `text` as it is: for the terminal sequences qxfer draws with itself.
    func writeVerbatim(_ text: String) {
        var text = text
        _ = text.withUTF8 { OutputFile.writeAll(UnsafeRawBufferPointer($0), to: rawValue) }
    }
}
