import ArgumentParser
import Logging
import QXfer

/// Options every subcommand takes.
struct GlobalOptions: ParsableArguments {
    @Flag(name: .shortAndLong, help: "Log more: -v for progress details, -vv for protocol traces.")
    var verbose: Int

    @Option(
        name: .customLong("config-dir"),
        help: ArgumentHelp(
            "Folder holding the identity and known hosts.",
            discussion: "Default: $XDG_CONFIG_HOME/qxfer, or ~/.config/qxfer.",
            valueName: "dir"))
    var configDirectory: String?

    var config: ConfigDirectory {
        configDirectory.map { ConfigDirectory(path: $0) } ?? .standard
    }

    /// Quiet by default: warnings only; -v info, -vv debug, -vvv trace.
    func bootstrapLogging() {
        let level: Logger.Level = switch verbose {
        case 0: .warning
        case 1: .info
        case 2: .debug
        default: .trace
        }
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }
}
