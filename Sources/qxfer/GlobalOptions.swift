import ArgumentParser
import FoundationEssentials
import Glibc
import Logging
import QXfer

/// Options every subcommand that connects takes.
struct GlobalOptions: ParsableArguments, ConfigurationFolder {
    @Flag(
        name: .shortAndLong,
        help: ArgumentHelp(
            "Log on standard error: -v the connection, trust and file events, -vv path samples and protocol details.",
            discussion: "-v: which stack and address won, the handshake, trust decisions, offers, each file and its resume point, the receiver found or advertised on the local network. -vv adds RTT and congestion window samples every second and every mDNS packet sent and received."))
    var verbose: Int

    @OptionGroup var folder: LocalOptions
    var configDirectory: String? { folder.configDirectory }

    /// Quiet by default: warnings only; -v info, -vv debug, -vvv trace.
    func bootstrapLogging() {
        let level: Logger.Level = switch verbose {
        case 0: .warning
        case 1: .info
        case 2: .debug
        default: .trace
        }
        LoggingSystem.bootstrap { label in LineLogHandler(label: label, logLevel: level) }
    }
}

/// Options of the subcommands that only read or write the configuration folder (`id`,
/// `devices`, `unpair`): no `-v`, which would have nothing to log there.
struct LocalOptions: ParsableArguments, ConfigurationFolder {
    @Option(
        name: .customLong("config-dir"),
        help: ArgumentHelp(
            "Folder holding the identity and known hosts.",
            discussion: "Default: $XDG_CONFIG_HOME/qxfer, or ~/.config/qxfer.",
            valueName: "dir"))
    var configDirectory: String?

    /// Warnings only, as the connecting commands without -v.
    func bootstrapLogging() {
        LoggingSystem.bootstrap { label in LineLogHandler(label: label, logLevel: .warning) }
    }
}

/// The configuration folder a command was given (`--config-dir`), and the identity in it.
protocol ConfigurationFolder {
    var configDirectory: String? { get }
}

extension ConfigurationFolder {
    var config: ConfigDirectory {
        configDirectory.map { ConfigDirectory(path: $0) } ?? .standard
    }

    /// This host's identity, created in the configuration folder on first use. Where it cannot
    /// be created (a read-only home, a service user whose home does not exist) the message says
    /// how to choose another folder.
    func identity() throws -> HostIdentity {
        do {
            return try HostIdentity.loadOrCreate(in: config)
        } catch let error as QXferError where !HostIdentity.exists(in: config) {
            throw QXferError(error.code, "\(error.message); choose a folder you can write with --config-dir DIR (or XDG_CONFIG_HOME)")
        }
    }
}

/// Log lines on standard error, `qxfer[info] qxfer.tls: …`, each on a line of its own (over a
/// progress bar, which redraws itself; above an open question).
struct LineLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level
    var metadata: Logger.Metadata = [:]

    init(label: String, logLevel: Logger.Level) {
        self.label = label
        self.logLevel = logLevel
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { _, new in new }
        let fields = merged.isEmpty ? "" : " " + merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        Console.writeLine("qxfer[\(event.level)] \(label): \(event.message)\(fields)")
    }
}
