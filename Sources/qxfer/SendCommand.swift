import ArgumentParser
import FoundationEssentials
import Glibc
import PlainText
import QXfer
import QXferPairing
import QXferReach
import QXferTransfer
import Synchronization

/// The port `qxfer recv` listens on by default, TCP and UDP alike.
let defaultTransferPort: UInt16 = 7447

/// TCP under transfers, both sides: a peer cut off without a FIN or RST is noticed in about
/// QUIC's 30 s idle timeout instead of TCP's quarter of an hour — keepalive probes after 15 s
/// of silence, and the connection fails once data or probes go unacknowledged for 30 s. The
/// sender then reconnects and resumes; the receiver lets go of the partials. A shorter cut
/// is ridden out by TCP's own retransmissions.
let transferTCP = TCP().keepAlive().userTimeout(.seconds(30))

/// The end-to-end digest, by the name help shows (ArgumentParser shows a `CaseIterable`
/// enum's raw value, and ``DigestAlgorithm``'s is its wire number).
enum ChecksumChoice: String, ExpressibleByArgument, CaseIterable {
    case xxh3 = "xxh3-128", sha256

    init?(argument: String) {
        switch argument.lowercased() {
        case "xxh3", "xxh3-128", "xxh128": self = .xxh3
        case "sha256", "sha-256": self = .sha256
        default: return nil
        }
    }

    var algorithm: DigestAlgorithm { self == .xxh3 ? .xxh3_128 : .sha256 }
}

struct SendCommand: AsyncParsableCommand, JSONOutput {
    static let configuration = CommandConfiguration(
        commandName: "send",
        abstract: "Send files and folders to a host running 'qxfer recv'.",
        usage: """
            qxfer send <path>... <host>[:<port>] [--stack auto|quic|tls] [--fingerprint <sha256>]
              qxfer send <path>... --to <name>
              qxfer send <path>... --code [--relay <host>[:<port>]]
              qxfer send <path>
            """,
        discussion: """
            EXAMPLES:
              qxfer send report.pdf photos/ otherhost  # QUIC (TCP+TLS if UDP blocked)
              qxfer send disk.img otherhost:7447 --stack tls     # TCP+TLS only
              qxfer send notes.txt --to office-pc    # found on the network by name
              qxfer send notes.txt                   # the one receiver on the network
              qxfer send big.iso --code --relay relay.example.org  # across NATs, by code
              tar c src | qxfer send - --name src.tar otherhost  # standard input
              qxfer send photos/ otherhost --json > events.jsonl # JSON event lines
              qxfer send src/ otherhost --exclude '*.o' --exclude build/  # not these
              qxfer send src/ --exclude .git/ --dry-run  # list, send nothing

            Run the same command again to resume an interrupted send. docs/COMMANDS.md tells \
            what is sent and skipped (exit 77, 74), resuming, the QUIC/TCP+TLS race, trust \
            on first use and reconnecting.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("Files or folders to send ('-' for standard input), then the receiving host.", valueName: "path… host[:port]"))
    var arguments: [String] = []

    @Option(help: ArgumentHelp("Send to the receiver advertised on the local network under this name.", valueName: "name"))
    var to: String?

    @Option(help: StackChoice.help)
    var stack: StackChoice = .auto

    @Option(help: ArgumentHelp("Require the receiver's certificate to have this SHA-256 fingerprint (as 'qxfer id' prints it).", valueName: "sha256"))
    var fingerprint: String?

    @Option(help: "End-to-end digest: xxh3-128 (fast) or sha256 (what sha256sum prints).")
    var checksum: ChecksumChoice = .xxh3

    @Option(help: "The name standard input gets on the receiver.")
    var name = "stdin"

    @Flag(help: "Print JSON event lines on standard output instead of a progress bar.")
    var json = false

    @Flag(help: ArgumentHelp("Print a code for 'qxfer recv CODE' and wait: no address needed, across NATs through a relay (--relay), or on this network with none."))
    var code = false

    @Option(help: ArgumentHelp("With --code: use this code instead of a random one (for scripts).", valueName: "code"))
    var useCode: String?

    @Option(help: ArgumentHelp("With --code: the relay both sides meet at (default: $QXFER_RELAY; with neither, the local network).", valueName: "host[:port]"))
    var relay: String?

    @Flag(help: "With --code: also keep the receiver as a paired device, as 'qxfer pair' does.")
    var pair = false

    @Option(help: ArgumentHelp("After a network failure of an accepted transfer, reconnect and resume for up to this many seconds (0: never).", valueName: "seconds"))
    var retryFor = 60

    @Flag(name: .shortAndLong, help: "Print no progress or other lines: only warnings, errors, and a summary when something was not transferred.")
    var quiet = false

    @Option(
        name: .customLong("exclude"),
        help: ArgumentHelp(
            "Leave out what matches (repeatable): a name at any depth ('*.tmp'), a folder with a trailing slash ('build/'), a path from the top of what is sent with a leading slash ('/photos/raw').",
            valueName: "pattern"))
    var exclude: [String] = []

    @Flag(help: "List what would be offered (each entry and its size, then the totals) and exit; connect to nothing. The host may be left out.")
    var dryRun = false

    /// The host given on the command line: the last argument, unless the receiver is found by
    /// name (`--to`) or a single path is sent to whichever receiver answers.
    var host: String? {
        guard to == nil, !byCode, arguments.count >= 2, let last = arguments.last else { return nil }
        // A dry run connects to nothing: its last argument may be one more path.
        if dryRun, FileManager.default.fileExists(atPath: last) { return nil }
        return last
    }

    /// Whether the receiver is met by a transfer code.
    var byCode: Bool { code || useCode != nil }

    var paths: [String] {
        host == nil ? arguments : Array(arguments.dropLast())
    }

    func validate() throws {
        if quiet && json { throw ValidationError("--quiet and --json: choose one (--json prints events, not lines)") }
        do { _ = try ExclusionRules(exclude) } catch { throw ValidationError(error.message) }
        if byCode {
            if to != nil || fingerprint != nil { throw ValidationError("--code finds and authenticates the receiver by itself: --to and --fingerprint do not apply") }
            if let useCode, TransferCode(parsing: useCode) == nil { throw ValidationError("'\(useCode)' is not a transfer code: \(TransferCode.form)") }
            _ = try CodeOptions.meetingPlace(relay)
        } else if relay != nil || pair {
            throw ValidationError("--relay and --pair go with --code")
        }
        if let host { _ = try parseDestination(host, defaultPort: defaultTransferPort) }
        if let host, !host.contains(":"), FileManager.default.fileExists(atPath: host) {
            // Resolving a file name as a host would only fail, seconds later.
            throw ValidationError(
                "'\(host)' is a local file, not a host: name the receiving host last (qxfer send FILE… HOST), "
                    + "use --to NAME to find it on the local network, or write a host of that name as \(host):\(defaultTransferPort)")
        }
        if let fingerprint, Fingerprint(parsing: fingerprint) == nil {
            throw ValidationError("'\(fingerprint)' is not a SHA-256 fingerprint (64 hex digits, colons allowed)")
        }
        if retryFor < 0 {
            throw ValidationError("--retry-for takes a number of seconds, 0 or more")
        }
        if paths.filter({ $0 == "-" }).count > 1 {
            throw ValidationError("standard input ('-') can be sent once")
        }
    }

    func run() async throws {
        // Here, not in validate(): ArgumentParser validates before it reports an unknown
        // option, and 'send --bogus' said "name what to send" instead of naming '--bogus'.
        guard !arguments.isEmpty else {
            throw ValidationError("name what to send and the receiving host: qxfer send FILE… HOST[:PORT]")
        }
        global.bootstrapLogging()
        // Ctrl-C closes the connection properly, so the receiver keeps its partial at once.
        try await cancellingOnInterrupt { try await transfer() }
    }

    private func transfer() async throws {
        let tree = try SourceTree.scan(paths, standardInputName: name, excluding: try ExclusionRules(exclude))
        if dryRun { return try DryRun.show(tree, json: json) }
        if paths.contains(where: { $0 != "-" }) { InterruptNote.sendingFiles(withStandardInput: paths.contains("-")) }
        if byCode { return try await transferByCode(tree) }
        let endpoint: Endpoint
        var discoveredName: String?
        if let host {
            endpoint = try parseDestination(host, defaultPort: defaultTransferPort)
        } else {
            let found = try await ReceiverDiscovery.resolve(name: to)
            endpoint = found.endpoint
            discoveredName = found.name
            if json {
                Console.emit("found", ["name": found.name, "host": endpoint.host, "port": endpoint.port])
            } else if !quiet {
                StandardStream.error.writeVerbatim("qxfer: found receiver '\(TerminalText.escaped(found.name))' at \(endpoint)\n")
            }
        }
        let identity = try global.identity()
        let receiverTrust = try ReceiverTrust(
            fingerprint: fingerprint, endpoint: endpoint, discoveredName: discoveredName, identity: identity, config: global.config)
        let reporter = TransferReporter(json: json, role: .sender, quiet: quiet)
        reporter.leftOut(tree)

        try await stack.run(
            Sending(command: self, tree: tree, endpoint: endpoint, trust: receiverTrust, reporter: reporter),
            identity: identity, trust: receiverTrust.trust, tcp: transferTCP, config: global.config,
            probesPathMTU: tree.totalSize >= Self.pathProbeThreshold || tree.sources.contains(.standardInput), leadsEarly: true)
    }

    /// Meets the receiver by a code (docs/PROTOCOL.md §9): shows the code, waits for the
    /// receiver, authenticates it over the pairing service, then sends as to any receiver,
    /// pinned to the fingerprint the code proved, and says which path carried the bytes.
    private func transferByCode(_ tree: SourceTree) async throws {
        let identity = try global.identity()
        try Pairing.checkAvailable()
        let place = try CodeOptions.meetingPlace(relay)
        let store = pair ? PairedDevices(in: global.config, identity: identity) : nil
        _ = try store?.devices()  // a damaged list stops us before the other side stores anything
        let reporter = TransferReporter(json: json, role: .sender)
        reporter.leftOut(tree)
        let json = self.json
        let fixed = useCode.flatMap(TransferCode.init(parsing:))
        try await CodeMeeting.offering(at: place, code: fixed, announce: { code in
            CodeOptions.announce(code, at: place, json: json)
        }) { meeting in
            let receiver = try await stack.run(
                CodeOptions.Authenticating(meeting: meeting, identity: identity, store: store),
                identity: identity, trust: .anyCertificate, config: global.config, byCode: true)
            reporter.info("the receiver '\(receiver.name)' knew the code: its fingerprint is \(receiver.fingerprint)")
            if store != nil { reporter.info("paired with '\(receiver.name)'") }
            reporter.carried(by: { CodeOptions.carried(meeting.path) })
            let endpoint = try await meeting.endpoint(for: .transfer)
            let trust = ReceiverTrust(authenticatedByCode: receiver.fingerprint, identity: identity, config: global.config)
            try await stack.run(
                Sending(command: self, tree: tree, endpoint: endpoint, trust: trust, reporter: reporter),
                identity: identity, trust: trust.trust, tcp: transferTCP, config: global.config,
                probesPathMTU: tree.totalSize >= Self.pathProbeThreshold || tree.sources.contains(.standardInput), byCode: true)
        }
    }

    /// What the command ends with once the receiver answered: every entry not transferred
    /// counted on the last line, those left out here (named as they were found) and those the
    /// receiver did not take alike. The exit status is the first one the receiver did not take,
    /// else 74 for items that could not be read, else 77 for names qxfer/1 cannot carry: a script
    /// that deletes its source after a send that exited 0 must not lose them. Sockets, FIFOs,
    /// devices and links leaving the tree hold nothing qxfer carries: alone, they leave the exit
    /// status 0, and the summary line counts them.
    static func notTransferred(_ summary: TransferSummary, leftOut tree: SourceTree) -> TransferError? {
        let received = summary.failures.dropFirst(tree.notSent.count)
        // A failure without a path had no line of its own (an older receiver's count): said as it is.
        if let unnamed = received.first(where: { $0.path.isEmpty }) { return unnamed.error }
        let code: TransferError.Code? = received.first?.error.code
            ?? (tree.unreadable > 0 ? .io : tree.unsentForTheirNames > 0 ? .unsafePath : nil)
        guard let code else { return nil }
        let total = summary.failures.count
        return TransferError(
            code,
            "\(count(total, "item", "items")) named above \(total == 1 ? "was" : "were") not transferred"
                + (summary.succeeded > 0 ? "; everything else arrived" : ""))
    }

    /// From this many bytes (or from standard input, of unknown length) QUIC first finds the
    /// path's datagram size: one round trip, against 2 % more data in every packet after it.
    static let pathProbeThreshold: UInt64 = 16 << 20

    /// The transfer, over whichever stack `--stack` chose.
    private struct Sending: OverChosenStack {
        let command: SendCommand
        let tree: SourceTree
        let endpoint: Endpoint
        let trust: ReceiverTrust
        let reporter: TransferReporter

        func run<Transport: SecureTransport>(over transport: Transport) async throws {
            try await command.send(tree, to: endpoint, over: transport, trust: trust, reporter: reporter)
        }
    }

    private func send<Transport: SecureTransport>(
        _ tree: SourceTree, to endpoint: Endpoint, over transport: Transport, trust: ReceiverTrust, reporter: TransferReporter
    ) async throws {
        let parameters = NetworkParameters.parameters { TLV { transport } }.performanceMode(.bulk)
        let clock = ContinuousClock()
        var moving = TransferClock()
        // Set once a receiver accepted: from then on a network failure is retried until then.
        var retryUntil: ContinuousClock.Instant?
        var backoff = Duration.milliseconds(250)
        var reconnects = 0
        var racedAfterEarly = false
        while true {
            let accepted = OnceFlag()
            do {
                var summary = try await attempt(
                    tree, parameters: parameters, endpoint: endpoint, trust: trust, reporter: reporter, clock: moving, accepted: accepted,
                    announce: reconnects == 0)
                // What was left out here is not transferred either: counted first, as named first.
                summary.failures = tree.notSent + summary.failures
                reporter.finish(summary, clock: moving, reconnects: reconnects, excluded: tree.excluded)
                if let notTransferred = Self.notTransferred(summary, leftOut: tree) { throw notTransferred }
                return
            } catch where !Task.isCancelled && Self.isNetworkFailure(error) {
                if !accepted.isSet, !racedAfterEarly, let note = earlyDataRetryNote(error, to: endpoint, racing: stack == .auto) {
                    racedAfterEarly = true
                    reporter.info(note)
                    moving = TransferClock()  // what that attempt wrote early was never accepted: not counted
                    continue
                }
                if accepted.isSet {
                    // This attempt got somewhere: the retry window starts again from now.
                    retryUntil = clock.now + .seconds(retryFor)
                    backoff = .milliseconds(250)
                }
                guard let deadline = retryUntil, retryFor > 0, clock.now + backoff < deadline else { throw Self.naming(endpoint, in: error) }
                reconnects += 1
                let reason = (error as? QXferError)?.message ?? "\(error)"
                reporter.reconnecting(reason: reason, after: backoff, attempt: reconnects)
                try await Task.sleep(for: backoff)
                backoff = min(backoff * 2, .seconds(4))
            }
        }
    }

    /// One connection: connect, offer, send what the receiver asks for.
    private func attempt<Stack: TLVStack>(
        _ tree: SourceTree, parameters: NetworkParameters<Stack>, endpoint: Endpoint, trust: ReceiverTrust,
        reporter: TransferReporter, clock: TransferClock, accepted: OnceFlag, announce: Bool
    ) async throws -> TransferSummary {
        let connection = NetworkConnection(to: endpoint, using: parameters)
        try await startFailingFast(connection)
        reporter.connected(over: connection.stackName)
        trust.connected(to: connection.peer)
        // -q: not the first-contact notice either (as ssh -q leaves out "Permanently added").
        if announce, !quiet, let notice = trust.notice(endpoint, connection.peer) { reporter.warn(notice) }
        let progress = clock.progress { event in
            if case .accepted = event { accepted.set() }
            reporter.handle(event)
        }
        clock.expect(files: tree.entries.count { $0.kind == .file })
        let sender = TransferSender(tree: tree, algorithm: checksum.algorithm, progress: progress)
        // Interrupted, the sender closes at once and returns once the close has left: the
        // receiver hears it now rather than at its idle timeout.
        return try await reporter.showProgress(of: sender.progress, clock: clock, metrics: { await connection.metrics }) {
            try await sender.run(over: connection)
        }
    }

    /// A connection failure whose message does not say where to: the same with "host:port: " before it.
    static func naming(_ endpoint: Endpoint, in error: any Error) -> any Error {
        guard let error = error as? QXferError, isNetworkFailure(error), !error.message.contains(endpoint.description) else { return error }
        return QXferError(error.code, "\(endpoint): \(error.message)", underlying: error.underlying)
    }

    /// Failures of the path or the connection, which a new connection may not meet; not the
    /// receiver's refusals, trust failures or local errors.
    static func isNetworkFailure(_ error: any Error) -> Bool {
        guard let error = error as? QXferError else { return false }
        return [.connectFailed, .handshakeFailed, .connectionClosed, .idleTimeout, .truncated].contains(error.code)
    }
}

/// A fact that becomes true once, seen from any task: the receiver accepted during an attempt,
/// a question was withdrawn.
final class OnceFlag: Sendable {
    private let value = Mutex(false)
    var isSet: Bool { value.withLock { $0 } }
    func set() { value.withLock { $0 = true } }
    /// Sets the flag; true if it was not set before.
    func setFirst() -> Bool { value.withLock { flag in defer { flag = true }; return !flag } }
}
