import ArgumentParser
import FoundationEssentials
import Glibc
import PlainText
import SafeOutput
import LinuxSystem
import Logging
import QXfer
import QXferPairing
import QXferReach
import QXferTransfer

struct RecvCommand: AsyncParsableCommand, JSONOutput {
    static let configuration = CommandConfiguration(
        commandName: "recv",
        abstract: "Receive files sent with 'qxfer send', over QUIC and TCP+TLS on one port number.",
        discussion: """
            EXAMPLES:
              qxfer recv                         # into this folder, asking for each offer
              qxfer recv --dir ~/incoming --yes  # accept every offer, no questions
              qxfer recv --paired-only --once    # paired senders only, one transfer
              qxfer recv --stdout | tar x        # one file to standard output
              qxfer recv --port 9000 --json      # JSON event lines on standard output
              qxfer recv --yes -q                # no banner or progress: problems only
              qxfer recv 7-apple-river-stone     # the code 'qxfer send --code' printed

            docs/COMMANDS.md tells how offers are checked, resumed and what an existing \
            file meets (--overwrite).
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("The code 'qxfer send --code' printed: receive that one transfer, from that sender only.", valueName: "code"))
    var code: String?

    @Option(help: ArgumentHelp("With a code: the relay both sides meet at (default: $QXFER_RELAY; with neither, the local network).", valueName: "host[:port]"))
    var relay: String?

    @Flag(help: "With a code: also keep the sender as a paired device, as 'qxfer pair' does.")
    var pair = false

    @Option(help: "The port, for both UDP (QUIC) and TCP (TLS).")
    var port: UInt16 = defaultTransferPort

    @Option(help: "The address to listen on (default: all).")
    var host: String?

    @Option(help: "The folder to receive into (created if missing, like rsync creates its last component).")
    var dir = "."

    @Flag(help: "Accept every offer without asking.")
    var yes = false

    @Option(parsing: .upToNextOption, help: ArgumentHelp("Admit only senders with these certificate fingerprints (mutual TLS).", valueName: "sha256"))
    var allow: [String] = []

    @Flag(help: "Admit only senders paired with 'qxfer pair' (mutual TLS against the paired devices; with --allow, those too).")
    var pairedOnly = false

    @Flag(help: "Exit after one transfer, with its result as the exit code (a connection closed before any offer is none).")
    var once = false

    @Flag(help: "Replace existing files, of another size or of the same size and other content (after the new one is verified).")
    var overwrite = false

    @Flag(help: "Print JSON event lines on standard output (on standard error with --stdout).")
    var json = false

    @Flag(name: .shortAndLong, help: "Print no banner, offers or progress: only questions, warnings, errors, refusals, and a summary when something was not transferred.")
    var quiet = false

    @Flag(
        name: .customLong("stdout"),
        help: ArgumentHelp(
            "Write the one file of one transfer to standard output (e.g. qxfer recv --stdout | tar x), then exit.",
            discussion: """
                The data goes out as it arrives; reports go to standard error. The digest is checked at the end, but \
                a pipe cannot be un-written: on a mismatch the command fails (exit 65) and says to discard what \
                came out. If the pipe's reader goes away, the transfer stops at once and its sender is told (exit 74 \
                on both sides); the sender succeeds only once the pipe has taken every byte. Offers of folders or \
                several files are declined. Nothing is resumed.
                """))
    var toStandardOutput = false

    @Option(help: ArgumentHelp("The name to advertise on the local network (default: the host name).", valueName: "name"))
    var name: String?

    @Flag(help: "Do not advertise this receiver on the local network (multicast DNS).")
    var noAdvertise = false

    func validate() throws {
        if quiet && json { throw ValidationError("--quiet and --json: choose one (--json prints events, not lines)") }
        if let code {
            guard TransferCode(parsing: code) != nil else { throw ValidationError("'\(code)' is not a transfer code: \(TransferCode.form)") }
            _ = try CodeOptions.meetingPlace(relay)
        } else if relay != nil || pair {
            throw ValidationError("--relay and --pair go with a code: qxfer recv CODE --relay HOST")
        }
        if toStandardOutput && (overwrite || dir != ".") { throw ValidationError("--stdout writes no file: --dir and --overwrite do not apply") }
        for fingerprint in allow where Fingerprint(parsing: fingerprint) == nil {
            throw ValidationError("'\(fingerprint)' is not a SHA-256 fingerprint (64 hex digits, colons allowed)")
        }
        if !toStandardOutput { try Self.checkTarget(dir) }
    }

    /// A folder to receive into: an existing one must be writable; a missing one needs a
    /// writable parent (only the last component is created).
    static func checkTarget(_ dir: String) throws {
        var info = stat()
        if stat(dir, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFDIR else { throw ValidationError("'\(dir)' is not a folder") }
            guard access(dir, W_OK | X_OK) == 0 else {
                throw ValidationError("cannot receive into '\(dir)': \(String(cString: strerror(errno)))")
            }
            return
        }
        let parent = OutputFile.folder(of: dir)
        guard stat(parent, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw ValidationError("'\(dir)' does not exist and neither does its parent folder '\(parent)' (only the last component is created)")
        }
        guard access(parent, W_OK | X_OK) == 0 else {
            throw ValidationError("cannot create '\(dir)': \(String(cString: strerror(errno)))")
        }
    }

    func run() async throws {
        global.bootstrapLogging()
        // A receiver moves each chunk of up to 1 MiB through a few buffers (engine, reader,
        // message; a reader's buffer is 2 MiB once NIO rounds it up): reused from the heap
        // instead of mapped and faulted in afresh, the receiver of 1 GiB over QUIC at MTU 1500
        // took 5 000 page faults instead of 37 000–110 000 (docs/benchmarks.md, "Page
        // faults"). Larger blocks are still mapped and at most 8 MiB of freed memory is kept.
        // Not the sender: it gains little, and on the lossy WAN its send buffer, grown and
        // shrunk with the losses, then peaked a few MiB higher (up to 69 MiB resident).
        MallocArenas.keepFreedBlocks(upTo: 3 << 20, retaining: 8 << 20)
        if toStandardOutput {
            Console.dataOnStandardOutput = true
            let relay = try StandardOutputRelay()
            defer { relay.remove() }
            try await cancellingOnInterrupt {
                try await relay.relaying {
                    try await meetingByCode { sender in try await receive(into: relay.directory, shown: "standard output", relay: relay, byCode: sender) }
                }
            }
            return
        }
        // Ctrl-C cancels the listeners, so the advertisement ends with a goodbye.
        try await cancellingOnInterrupt {
            try await meetingByCode { sender in try await receive(into: dir, shown: dir, relay: nil, byCode: sender) }
        }
    }

    /// A sender met by a code: the meeting that carries its connections and the fingerprint
    /// the code proved.
    struct CodeSender: Sendable {
        let meeting: CodeMeeting
        let fingerprint: Fingerprint
        /// The name it gave in the code's exchange.
        let name: String
    }

    /// Runs `body` directly, or with a code, once the sender has been met and authenticated.
    private func meetingByCode(_ body: (CodeSender?) async throws -> Void) async throws {
        guard let code = code.flatMap(TransferCode.init(parsing:)) else { return try await body(nil) }
        try Pairing.checkAvailable()
        let identity = try global.identity()
        let store = pair ? PairedDevices(in: global.config, identity: identity) : nil
        _ = try store?.devices()
        let place = try CodeOptions.meetingPlace(relay)
        try await CodeMeeting.answering(code, at: place) { meeting in
            let sender = try await meeting.awaitPeer(identity: identity, name: name ?? ReceiverDiscovery.defaultName, store: store)
            Logger(label: "qxfer.recv").info("the sender '\(sender.name)' knew the code: its fingerprint is \(sender.fingerprint)")
            if store != nil { Console.warn("paired with '\(sender.name)'") }
            try await body(CodeSender(meeting: meeting, fingerprint: sender.fingerprint, name: sender.name))
        }
    }

    /// Serves senders, receiving into `folder` (named `shown` in the banner); with a `relay`, one
    /// transfer whose file goes to standard output.
    private func receive(into folder: String, shown: String, relay: StandardOutputRelay?, byCode sender: CodeSender?) async throws {
        let identity = try global.identity()
        let pairedDevices = PairedDevices(in: global.config, identity: identity)
        let paired = try pairedDevices.devices()  // a damaged list is an error here, not an open door
        let allowed = allow.compactMap { Fingerprint(parsing: $0) }
        let pairedNames = Dictionary(paired.map { ($0.fingerprint, $0.name) }) { _, last in last }
        // A paired sender is admitted as paired, not as unauthenticated, whatever else is asked.
        let admitted: ClientAuthentication =
            if let sender { .required(allowing: [sender.fingerprint]) }
            else if pairedOnly { .pairedDevices(paired.map(\.fingerprint) + allowed) }
            else if allowed.isEmpty { .optional }
            else { .required(allowing: allowed) }
        let authentication = admitted.recognizingPairedDevices(pairedNames)
        let reporter = TransferReporter(json: json, role: .receiver, pairedNames: pairedNames, quiet: quiet)
        if let sender { reporter.carried(by: { CodeOptions.carried(sender.meeting.path) }) }
        if pairedOnly && paired.isEmpty && allowed.isEmpty {
            reporter.warn("--paired-only with no paired devices: every sender will be refused; pair one with 'qxfer pair'")
        }
        // Every connection's framer holds the message it is receiving (up to 16 MiB) before
        // the receiver sees it: one allowance for all of them, so that thousands of connections
        // (QUIC: and streams) each sending a long message cannot make this process hold more.
        let messages = MessageAllowance(bytes: UsableMemory.share(1, of: 8, atLeast: 128 << 20, atMost: 2 << 30))
        // A code's sender arrives through the meeting's local end: any port of the loopback.
        let (port, host) = sender == nil ? (self.port, self.host) : (0, "127.0.0.1")
        let quicLayer = sender == nil ? QUIC() : QUIC().tunnelledThroughLoopback()
        let tls = NetworkListener(on: port, host: host, using: .parameters {
            TLV(allowance: messages) { TLS { transferTCP }.identity(identity).clientAuthentication(authentication) }
        }.performanceMode(.bulk))
        let prompt = OfferPrompt(acceptAll: yes, reporter: reporter)
        let knownHosts = KnownHosts(in: global.config)
        // Each connection asks through the prompt with its own withdrawal check (handle).
        let receiver = TransferReceiver(directory: folder, overwrite: overwrite, confirm: { _ in false })
        let (results, finished) = AsyncStream.makeStream(of: Result<TransferSummary, any Error>.self)

        try await withThrowingTaskGroup(of: Child.self) { group in
            group.addTask {
                try await tls.run(refused: { reporter.refused($0) }) { connection in
                    defer { MallocArenas.giveBackFreePages() }  // see handle
                    try await handle(connection, receiver, prompt, relay, reporter, pairedDevices, knownHosts, sender, finished)
                }
                return .listener
            }
            // QUIC takes the same number on UDP (the one TCP got, when asked for any port).
            let boundPort = try await tls.port
            let quic = NetworkListener(on: boundPort, host: host, using: .parameters {
                // A known sender's early data is read at once, taken once per ClientHello by
                // every receiver of this configuration folder (docs/SECURITY.md).
                TLV(allowance: messages) {
                    quicLayer.identity(identity).clientAuthentication(authentication).earlyDataRegister(EarlyDataRegister(in: global.config))
                }
            }.performanceMode(.bulk))
            group.addTask {
                try await quic.run(refused: { reporter.refused($0) }) { connection in
                    defer { MallocArenas.giveBackFreePages() }  // see handle
                    try await handle(connection, receiver, prompt, relay, reporter, pairedDevices, knownHosts, sender, finished)
                }
                return .listener
            }
            _ = try await quic.port
            sender?.meeting.serve(.transfer, onLocalPort: boundPort)
            // Made once both listen: a receiver that cannot start leaves no new empty folder.
            if access(folder, F_OK) != 0 {
                guard mkdir(folder, 0o755) == 0 || errno == EEXIST else {
                    throw ValidationError("cannot create '\(folder)': \(String(cString: strerror(errno)))")
                }
                reporter.warn("created the folder '\(folder)'")
            }
            let advertisedName = name ?? ReceiverDiscovery.defaultName
            if sender == nil {
                reporter.listening(name: advertisedName, port: boundPort, addresses: host.map { [$0] } ?? localAddresses(), fingerprint: identity.fingerprint, folder: shown)
            }
            if !noAdvertise && sender == nil {
                group.addTask {
                    await ReceiverDiscovery.advertise(name: advertisedName, port: boundPort, fingerprint: identity.fingerprint) { registered in
                        if registered != advertisedName { reporter.warn("another receiver is called '\(advertisedName)' here; advertising as '\(registered)'") }
                    }
                    return .advertiser
                }
            }
            guard servesOneTransfer else {
                // Serve until a listener stops (it throws why); advertising may end on its own.
                while let child = try await group.next(), child != .listener {}
                return
            }
            for await result in results {
                group.cancelAll()
                if case .failure(let error) = result { throw error }
                if let notTransferred = try result.get().notTransferred { throw notTransferred }
                return
            }
        }
    }

    /// Whether this receiver ends with its first transfer (--once, --stdout), whose result is
    /// the command's.
    private var servesOneTransfer: Bool { once || toStandardOutput || code != nil }

    /// The tasks a receiver runs side by side.
    private enum Child { case listener, advertiser }

    /// One connection: one transfer, its report, its result. Once it has returned, the
    /// listener's closure gives the free heap pages back: a receiver that stays would otherwise
    /// keep much of what its largest offer took resident while idle (139 to 240 MiB after a
    /// declined offer of 1 000 000 files, 33 MB; 76 MiB with the pages given back).
    private func handle<Stack: TLVStack>(
        _ connection: NetworkConnection<Stack>, _ receiver: TransferReceiver, _ prompt: OfferPrompt, _ relay: StandardOutputRelay?,
        _ reporter: TransferReporter, _ pairedDevices: PairedDevices, _ knownHosts: KnownHosts, _ codeSender: CodeSender?,
        _ finished: AsyncStream<Result<TransferSummary, any Error>>.Continuation
    ) async throws {
        // Each connection gets its own counters and clock, so concurrent transfers do not mix.
        var receiver = receiver
        let clock = TransferClock()
        // A reception into a folder keeps its unfinished files for resuming (--stdout resumes
        // nothing): under way from its acceptance until this connection's handling ends.
        let accepted = OnceFlag()
        // Standard input (any file of unknown size) is read anew by the next send: not resumed.
        let ofUnknownSize = OnceFlag()
        defer { if accepted.isSet { InterruptNote.receptionEnded(ofUnknownSize: ofUnknownSize.isSet) } }
        let offered = OnceFlag()
        receiver.progress = clock.progress { event in
            if case .offered(_, _, let unknown) = event {
                offered.set()
                if unknown > 0 { ofUnknownSize.set() }
            }
            if case .accepted = event, relay == nil, accepted.setFirst() { InterruptNote.receptionStarted(ofUnknownSize: ofUnknownSize.isSet) }
            relay?.note(event)
            reporter.handle(event)
        }
        // The question about this offer is withdrawn if this sender goes away before the answer.
        let withdrawn = OnceFlag()
        // A refusal with its reason for the sender, which this side showed as "declined: …".
        let declined = OnceFlag()
        let peer = codeSender.map(Self.peer(byCode:)) ?? Self.peer(of: connection, pairedNames: reporter.pairedNames, knownHosts: knownHosts)
        receiver.confirm = { offer in
            clock.expect(files: offer.fileCount)
            do {
                if let reason = relay?.refusal(for: offer) {
                    reporter.offer(offer, from: peer)
                    reporter.warn("declined: \(reason)")
                    throw TransferError(.refused, reason)
                }
                return try await prompt.ask(offer, from: peer) {
                    guard await connection.peerHasEnded else { return false }
                    withdrawn.set()
                    return true
                }
            } catch {
                declined.set()
                throw error
            }
        }
        if let relay {
            receiver.localFailure = { await relay.copyFailure() }
            receiver.beforeComplete = { await relay.delivered() }
        }
        let sender = connection.peer?.fingerprint
        let stack = connection.stackName  // read while connected: the summary comes after the close
        if let sender { try? pairedDevices.markSeen(sender) }  // "last seen" is a courtesy, not worth a failure
        if let admitted = connection.peer {
            Logger(label: "qxfer.recv").info("connection from \(peer.address ?? "?"), \(sender.map { "fingerprint \($0)" } ?? "no certificate") (admitted as \(admitted.trust))")
        }
        do {
            let running = receiver
            let summary = try await reporter.showProgress(of: running.progress, clock: clock, metrics: { await connection.metrics }) {
                try await running.run(over: connection)
            }
            reporter.finish(summary, clock: clock, over: stack)
            finished.yield(.success(summary))
        } catch let superseded as TransferSuperseded {
            // The same sender reconnected: its transfer goes on in the new connection, whose
            // result is the one that counts (--once).
            reporter.warn("transfer from \(sender?.description ?? "unknown sender") continues on a new connection: \(superseded.message)")
        } catch is CancellationError {
            // This receiver is stopping (Ctrl-C, or --once has its transfer): nothing failed here.
        } catch where !offered.isSet && Self.wentAway(error) {
            // Gone before an offer, so no transfer: a sender's race closes the connection it did
            // not pick, even once both handshakes have completed, and a port probe offers
            // nothing. Neither may end --once or read as a failed transfer.
            reporter.info("connection from \(sender?.description ?? "a sender without a certificate") closed before an offer: \(TransferReporter.message(of: error))")
        } catch {
            // The reason was shown with the offer, and is worded for the sender.
            let error = declined.isSet ? TransferError(.refused, "the offer was declined") : error
            // The withdrawal said it already; under --once the command's own error says it.
            if !withdrawn.isSet && !(servesOneTransfer && reporter.style != .json) { reporter.failed(error, peer: sender) }
            finished.yield(.failure(error))
        }
    }

    /// Who is on the other end of `connection`: its address, its fingerprint, and its name where
    /// this receiver knows one: paired under it, else the host it is recorded as in `known_hosts`
    /// (this machine once sent to it; the port is left out).
    static func peer<Stack>(
        of connection: NetworkConnection<Stack>, pairedNames: [Fingerprint: String], knownHosts: KnownHosts
    ) -> TransferReporter.Peer {
        let fingerprint = connection.peer?.fingerprint
        var peer = TransferReporter.Peer(address: connection.endpoint?.description, fingerprint: fingerprint)
        guard let fingerprint else { return peer }
        if let name = pairedNames[fingerprint] {
            peer.name = name
            peer.nameSource = .paired
        } else if let entry = (try? knownHosts.entries())?.first(where: { $0.fingerprint == fingerprint }) {
            // "[::1]:7447" → "::1", "laptop.local:7447" → "laptop.local".
            var host = entry.host
            if let colon = host.lastIndex(of: ":") { host = String(host[..<colon]) }
            if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
            peer.name = host
            peer.nameSource = .knownHosts
        }
        return peer
    }

    /// A sender met by a code: its address here is the meeting's local end, so it is named by
    /// the code's exchange and the path's far end.
    static func peer(byCode sender: CodeSender) -> TransferReporter.Peer {
        var peer = TransferReporter.Peer(address: "the relay", fingerprint: sender.fingerprint, name: sender.name, nameSource: .code)
        if case .direct(let address) = sender.meeting.path.route { peer.address = address }
        return peer
    }

    /// Whether `error` says the peer closed, reset or abandoned the connection (not that it
    /// sent something wrong).
    private static func wentAway(_ error: any Error) -> Bool {
        if let error = error as? TransferError { return error.code == .cancelled }
        guard let error = error as? QXferError else { return false }
        return [.connectionClosed, .truncated, .endOfStream, .idleTimeout, .cancelled].contains(error.code)
    }
}

/// The machine's non-loopback addresses, for the banner.
func localAddresses() -> [String] {
    var list: UnsafeMutablePointer<ifaddrs>?
    guard getifaddrs(&list) == 0, let first = list else { return [] }
    defer { freeifaddrs(list) }
    var addresses: [String] = []
    for entry in sequence(first: first, next: { $0.pointee.ifa_next }) {
        guard let address = entry.pointee.ifa_addr, entry.pointee.ifa_flags & UInt32(IFF_LOOPBACK) == 0 else { continue }
        let family = Int32(address.pointee.sa_family)
        guard family == AF_INET || family == AF_INET6 else { continue }
        var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        let length = socklen_t(family == AF_INET ? MemoryLayout<sockaddr_in>.size : MemoryLayout<sockaddr_in6>.size)
        if getnameinfo(address, length, &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST) == 0 {
            addresses.append(String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
    }
    return addresses
}

/// Asks the user about each offer, one at a time, on the terminal.
actor OfferPrompt {
    let acceptAll: Bool
    let reporter: TransferReporter
    /// Whether a question is on the terminal, and the offers waiting for their turn (the actor
    /// is re-entered while a question waits for its answer).
    private var asking = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(acceptAll: Bool, reporter: TransferReporter) {
        self.acceptAll = acceptAll
        self.reporter = reporter
    }

    /// Shows `offer` and, unless every offer is accepted, asks on the terminal. The progress bar
    /// is held back while the question is open; keys typed before it are discarded; it is
    /// withdrawn (declined) as soon as `withdrawn` says the sender has gone. With no terminal
    /// and no --yes it throws the refusal, whose reason the sender is shown.
    func ask(_ offer: IncomingOffer, from peer: TransferReporter.Peer, withdrawn: @Sendable () async -> Bool) async throws -> Bool {
        guard !acceptAll, isatty(STDIN_FILENO) == 1 else {
            if !reporter.quiet || !acceptAll { reporter.offer(offer, from: peer) }  // a declined offer says whose
            if !acceptAll {
                reporter.warn("declined: no terminal to ask on; run 'qxfer recv --yes' to accept without asking")
                throw TransferError(.refused, "it has no terminal to ask on and runs without --yes")
            }
            return true
        }
        while asking { await withCheckedContinuation { waiting.append($0) } }
        asking = true
        defer {
            asking = false
            if !waiting.isEmpty { waiting.removeFirst().resume() }
        }
        if await withdrawn() { return false }  // gone while waiting for its turn: nothing to ask
        reporter.offer(offer, from: peer)
        // With --json the event goes to standard output (a file, a pipe): the person answering
        // on the terminal sees who offers what all the same.
        if reporter.style == .json && !StandardStream.output.isTerminal {
            Console.writeLine("qxfer: " + reporter.offerLine(offer, from: peer), to: .error)
        }
        tcflush(STDIN_FILENO, TCIFLUSH)  // typed ahead, before the question: not its answer
        Console.beginQuestion("Accept? [y/N] ")
        var withdrawal: String?
        defer { Console.endQuestion(saying: withdrawal) }
        while !Task.isCancelled {
            if await withdrawn() {
                withdrawal = "the sender went away; the question is withdrawn"
                return false
            }
            var ready = pollfd(fd: STDIN_FILENO, events: Int16(POLLIN), revents: 0)
            guard poll(&ready, 1, 0) > 0 else {
                try? await Task.sleep(for: .milliseconds(100))
                continue
            }
            // The terminal is in canonical mode: one read returns one line (Enter pressed).
            var line = [UInt8](repeating: 0, count: 256)
            let count = read(STDIN_FILENO, &line, line.count)
            guard count > 0 else { return false }  // end of input: no
            let answer = TextFormat.trimmed(String(decoding: line.prefix(count), as: UTF8.self)).lowercased()
            return answer == "y" || answer == "yes"
        }
        return false
    }
}
