/// Where a command's examples go in its help: after USAGE, before the options.
///
/// ArgumentParser prints a command's `discussion` inside OVERVIEW, before USAGE (1.8:
/// `HelpGenerator.rendered` is OVERVIEW = abstract + discussion, USAGE, then ARGUMENTS, OPTIONS
/// and SUBCOMMANDS). Each command's discussion holds only its EXAMPLES (and, for `qxfer`, its
/// EXIT CODES); this moves that block, as ArgumentParser wrapped it, to just after USAGE, so a
/// help reads overview, usage, examples, options (as croc's, rsync's and ffmpeg's lead with
/// theirs). The long explanations are in docs/COMMANDS.md.
enum HelpLayout {
    /// The heading that starts the block to move.
    static let examplesHeading = "EXAMPLES:"

    /// `help` with the block from its EXAMPLES line to the line before USAGE moved to after
    /// the USAGE block; any other text (a version, a help without examples) unchanged.
    static func examplesAfterUsage(_ help: String) -> String {
        var lines = help.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard let usage = lines.firstIndex(where: { $0.hasPrefix("USAGE: ") }),
              let examples = lines[..<usage].firstIndex(of: examplesHeading) else { return help }
        var block = Array(lines[examples..<usage])
        while block.last?.isEmpty == true { block.removeLast() }
        lines.removeSubrange(examples..<usage)
        // The USAGE block ends at its first empty line.
        let usageStart = usage - (usage - examples)
        guard let usageEnd = lines[usageStart...].firstIndex(of: "") else { return help }
        lines.insert(contentsOf: block + [""], at: usageEnd + 1)
        return lines.joined(separator: "\n")
    }
}
