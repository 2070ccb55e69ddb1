import ArgumentParser
import FoundationEssentials
import Glibc
import LinuxSystem
import PlainText
import QXfer
import QXferPairing
import QXferReach
import QXferTransfer

@main
struct QXferCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "qxfer",
        abstract: "Move files and live frames between two machines over TCP+TLS or QUIC.",
        discussion: """
            EXAMPLES:
              qxfer recv                        # receive into this folder, port 7447
              qxfer send photos/ notes.txt otherhost
              qxfer id                          # the fingerprint peers pin
              qxfer pair                        # then 'qxfer pair thishost' on the other
              qxfer stream recv --output out.ivf
              qxfer stream send otherhost --input clip.ivf

            'qxfer COMMAND --help' for each; docs/COMMANDS.md and README.md for the details.

            Exit codes: 0 success, 64 usage, 65 verification failed (digest mismatch), 69 \
            network unavailable or the peer went away, 73 target exists or is being received by another sender (not overwritten) or is too large for the receiving side, \
            74 local I/O error or disk full, 76 protocol error (malformed or unexpected data \
            from the peer), 77 untrusted, refused or unsafe (peer refused, offer declined, \
            path refused), 78 identity or configuration, 130 interrupted (Ctrl-C or SIGTERM).
            """,
        version: QXferVersion.string,
        subcommands: [
            SendCommand.self, RecvCommand.self, StreamCommand.self, BrowseCommand.self, PairCommand.self, DevicesCommand.self,
            UnpairCommand.self, IdentityCommand.self,
            RelayCommand.self,
        ]
    )

    /// Parses, runs, and turns every failure into one line on standard error and an exit code.
    static func main() async {
        // Buffers move between NIO's event loop threads and Swift's task threads; with one
        // malloc arena per thread, memory freed on one thread stays reserved for it, and a
        // receiver that drains a backlog in bursts peaked at 56–64 MiB (faults.sh, slow reader,
        // QUIC, four runs; 66 in CI) against 53–59 MiB with two arenas: the brief wants < 64.
        MallocArenas.limit(to: 2)
        OpenFileLimit.raiseToHard()
        // Before parsing, for usage errors; the parsed command says for sure.
        Console.json = CommandLine.arguments.contains("--json")
        if let argument = firstArgumentNotUTF8() {
            fail(
                "the argument '\(argument)' is not valid UTF-8, and qxfer takes paths and names in UTF-8 only (a folder so named can be given as '.' from inside it)",
                code: "usage", status: 64)
        }
        if CommandLine.arguments.count <= 1 {
            // No command at all is a usage error, as a missing argument is: 64, usage on stderr.
            StandardStream.error.write(HelpLayout.examplesAfterUsage(helpMessage()) + "\n")
            Glibc.exit(64)
        }
        do {
            var command = try parseAsRoot()
            Console.json = Self.wantsJSON(command)
            if var command = command as? any AsyncParsableCommand {
                try await command.run()
            } else {
                try command.run()
            }
        } catch is CancellationError {
            interrupted()
        } catch let error as QXferError where error.code == .cancelled {
            interrupted()
        } catch let error as QXferError {
            fail(error.message, code: error.code.name, status: ExitCodes.code(for: error))
        } catch let error as TransferError {
            fail(error.message, code: error.code.name, status: ExitCodes.code(for: error))
        } catch let error as PairingError {
            fail(error.message, code: "pairing-\(error.kind)", status: ExitCodes.code(for: error))
        } catch let error as ReachError {
            fail(error.description, code: "code-\(error.kind)", status: ExitCodes.code(for: error))
        } catch {
            let code = exitCode(for: error)
            if code == .success {
                // --help (examples moved after the usage), --version
                StandardStream.output.write(HelpLayout.examplesAfterUsage(fullMessage(for: error)) + "\n")
                Glibc.exit(0)
            }
            if error is CleanExit { exit(withError: error) }
            fail(message(for: error), code: "usage", status: code.rawValue)
        }
    }

    /// The first argument whose bytes are not UTF-8, escaped to be shown. Swift hands arguments
    /// over with such bytes replaced by U+FFFD, so `recv --dir` would have made and filled a
    /// folder of another name, and `send` reported an existing file missing.
    private static func firstArgumentNotUTF8() -> String? {
        for index in 1..<max(Int(CommandLine.argc), 1) {  // argc may be 0 (execve with no arguments)
            guard let argument = CommandLine.unsafeArgv[index] else { continue }
            let bytes = UnsafeRawBufferPointer(start: argument, count: strlen(argument))
            if String(validating: bytes, as: UTF8.self) == nil { return TerminalText.escaped(bytes: bytes) }
        }
        return nil
    }

    private static func wantsJSON(_ command: any ParsableCommand) -> Bool {
        (command as? any JSONOutput)?.json ?? false
    }

    private static func interrupted() -> Never {
        fail(InterruptNote.message, code: "interrupted", status: 130)
    }

    private static func fail(_ message: String, code: String, status: Int32) -> Never {
        Console.fatal(message, code: code, exitStatus: status)
        Glibc.exit(status)
    }
}

/// A command with a `--json` flag: its fatal errors are JSON events too.
protocol JSONOutput {
    var json: Bool { get }
}

enum QXferVersion {
    static let string = "0.1.0"
}

/// Exit codes, from BSD's sysexits.h so scripts can tell failures apart.
enum ExitCodes {
    static func code(for error: QXferError) -> Int32 {
        switch error.code {
        case .fingerprintMismatch, .untrustedPeer, .protocolMismatch: 77  // EX_NOPERM
        case .connectFailed, .connectionClosed, .idleTimeout, .handshakeFailed, .bindFailed: 69  // EX_UNAVAILABLE
        case .malformedMessage, .messageTooLarge, .truncated: 76  // EX_PROTOCOL
        case .identity: 78  // EX_CONFIG
        case .serviceNotFound: 69  // EX_UNAVAILABLE
        case .ambiguousService, .invalidUse: 64  // EX_USAGE
        default: 1
        }
    }

    static func code(for error: PairingError) -> Int32 {
        switch error.kind {
        case .wrongCode, .refusedByPeer: 77  // EX_NOPERM
        case .timedOut, .unavailable: 69  // EX_UNAVAILABLE
        case .protocolViolation: 76  // EX_PROTOCOL
        case .storage: 74  // EX_IOERR
        }
    }

    static func code(for error: ReachError) -> Int32 {
        switch error.kind {
        case .wrongCode: 77  // EX_NOPERM
        case .relayUnreachable, .roomTaken, .noSuchCode, .codeUsed, .refusedByRelay, .peerGone: 69  // EX_UNAVAILABLE
        case .timedOut: 75  // EX_TEMPFAIL
        case .protocolViolation: 76  // EX_PROTOCOL
        case .local: 71  // EX_OSERR
        }
    }

    static func code(for error: TransferError) -> Int32 {
        switch error.code {
        case .digestMismatch: 65  // EX_DATAERR
        case .cancelled: 69  // EX_UNAVAILABLE: the peer went away; run again to resume
        case .exists, .busy, .tooLarge: 73  // EX_CANTCREAT
        case .io, .noSpace: 74  // EX_IOERR
        case .malformed, .limitExceeded, .protocolViolation, .unsupported, .internal: 76  // EX_PROTOCOL
        case .refused, .unsafePath: 77  // EX_NOPERM
        default: 1
        }
    }
}
