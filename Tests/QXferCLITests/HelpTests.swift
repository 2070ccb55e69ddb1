import ArgumentParser
import Foundation
import Testing
@testable import qxfer

/// Every command's `--help` as the real binary prints it (issue 62 §10): a short overview, then
/// USAGE, then EXAMPLES that parse, then the options; the long explanations in docs/COMMANDS.md.
@Suite("qxfer --help: overview, usage, examples, options")
struct HelpTests {
    typealias Scratch = CLITests.Scratch

    static let commands: [[String]] = [
        [], ["send"], ["recv"], ["stream"], ["stream", "send"], ["stream", "recv"], ["browse"], ["pair"], ["devices"],
        ["unpair"], ["id"], ["relay"],
    ]

    /// The lines of `help` under its EXAMPLES heading, up to the first empty line.
    static func examples(in help: [Substring]) -> [Substring] {
        guard let start = help.firstIndex(of: "EXAMPLES:") else { return [] }
        return Array(help[(start + 1)...].prefix { !$0.isEmpty })
    }

    /// The arguments after `qxfer` in one example line (up to a comment, pipe or redirection),
    /// as a shell would split them; nil if the line does not run qxfer.
    static func qxferArguments(of line: Substring, home: String) -> [String]? {
        var words = line.split(separator: "#", maxSplits: 1).first.map { $0.split(separator: " ").map(String.init) } ?? []
        guard let start = words.firstIndex(of: "qxfer") else { return nil }
        words = Array(words[(start + 1)...].prefix { !["|", ">", "<", "&&"].contains($0) })
        return words.map { $0.hasPrefix("~/") ? home + $0.dropFirst() : $0 }
    }

    @Test("Each help: OVERVIEW, USAGE, EXAMPLES, then the options, within 60 lines before them", arguments: commands)
    func order(command: [String]) async throws {
        let run = try await CLITests.qxfer(command + ["--help"], home: Scratch())
        #expect(run.status == 0)
        let lines = run.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        func line(_ prefix: String) -> Int? { lines.firstIndex { $0.hasPrefix(prefix) } }
        let overview = try #require(line("OVERVIEW: "), "\(run.stdout)")
        let usage = try #require(line("USAGE: "), "\(run.stdout)")
        let examples = try #require(line("EXAMPLES:"), "\(run.stdout)")
        let options = try #require(line("OPTIONS:"), "\(run.stdout)")
        let arguments = line("ARGUMENTS:") ?? options
        #expect(overview == 0 && overview < usage && usage < examples && examples < min(arguments, options), "\(run.stdout)")
        #expect(options <= 60, "\(options) lines before OPTIONS:\n\(run.stdout)")
        // The overview is one paragraph: nothing but it before USAGE.
        #expect(!lines[overview..<usage].dropLast().contains(""), "more than a paragraph before USAGE:\n\(run.stdout)")
        // Each example on one line, as written: none wrapped by the terminal width.
        let shown = Self.examples(in: lines)
        #expect(shown.count >= 1, "\(run.stdout)")
        for example in shown {
            #expect(example.hasPrefix("  ") && !example.hasPrefix("   "), "an example wrapped: '\(example)'\n\(run.stdout)")
        }
        // `qxfer help COMMAND` says the same.
        let viaHelp = try await CLITests.qxfer(["help"] + command, home: Scratch())
        #expect(viaHelp.stdout == run.stdout)
    }

    @Test("Every example parses as the command line it shows (options, values, validation)", arguments: commands)
    func examplesParse(command: [String]) async throws {
        let home = Scratch()
        let run = try await CLITests.qxfer(command + ["--help"], home: home)
        let examples = Self.examples(in: run.stdout.split(separator: "\n", omittingEmptySubsequences: false))
        var parsed = 0
        // Validation runs too: recv checks that it can write to its folder (the test's current
        // one, or a `~/` one in the scratch home), send that its host is not a local file.
        for example in examples {
            guard let arguments = Self.qxferArguments(of: example, home: home.path) else { continue }
            do {
                let parsedCommand = try QXferCommand.parseAsRoot(arguments)
                let name = type(of: parsedCommand).configuration.commandName ?? ""
                #expect(arguments.contains(name), "'\(example)' parsed as '\(name)'")
                parsed += 1
            } catch {
                Issue.record("'\(example)' does not parse: \(QXferCommand.message(for: error))")
            }
        }
        #expect(parsed >= 1, "no example runs qxfer:\n\(run.stdout)")
    }

    @Test("The layout moves only an EXAMPLES block that ArgumentParser put before USAGE")
    func layout() {
        let help = "OVERVIEW: Does a thing.\n\nEXAMPLES:\n  qxfer x\n\nMore.\n\nUSAGE: qxfer x\n       qxfer y\n\nOPTIONS:\n  -h\n"
        #expect(HelpLayout.examplesAfterUsage(help)
            == "OVERVIEW: Does a thing.\n\nUSAGE: qxfer x\n       qxfer y\n\nEXAMPLES:\n  qxfer x\n\nMore.\n\nOPTIONS:\n  -h\n")
        #expect(HelpLayout.examplesAfterUsage("0.1.0") == "0.1.0")
        let plain = "OVERVIEW: x\n\nUSAGE: y\n\nOPTIONS:\n"
        #expect(HelpLayout.examplesAfterUsage(plain) == plain)
    }

    @Test("What left the help is in docs/COMMANDS.md, which each help names")
    func explanationsMoved() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let commands = try String(contentsOf: root.appendingPathComponent("docs/COMMANDS.md"), encoding: .utf8)
        let flat = commands.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        for sentence in [
            "keys typed before it appears are discarded", "a race QUIC merely lost is not", "exits 77 once the rest has arrived",
            "A second sender waits up to 15 s", "a man in the middle gets a single guess", "files 0600, folder 0700",
        ] {
            #expect(flat.contains(sentence), "'\(sentence)' is not in docs/COMMANDS.md")
        }
        for command in [["send"], ["recv"], ["stream", "send"], ["stream", "recv"], ["pair"], ["browse"], ["id"]] {
            let run = try await CLITests.qxfer(command + ["--help"], home: Scratch())
            #expect(run.stdout.contains("docs/COMMANDS.md"), "\(command) --help does not name docs/COMMANDS.md")
        }
    }
}
