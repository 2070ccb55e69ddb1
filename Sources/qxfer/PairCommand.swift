import ArgumentParser
import FoundationEssentials
import Glibc
import PlainText
import QXfer
import QXferPairing
import Synchronization

/// The port `qxfer pair` waits on by default (TCP and UDP), beside transfer's and streaming's.
let defaultPairingPort: UInt16 = 7449

struct PairCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pair",
        abstract: "Pair with another machine once, with a six-digit code; from then on each trusts the other.",
        usage: """
            qxfer pair [--port <port>] [--code <code>] [--name <name>]     (the machine that waits)
              qxfer pair <host>[:<port>] [--code <code>] [--stack auto|quic|tls]  (the other one)
            """,
        discussion: """
            EXAMPLES:
              qxfer pair                    # on one machine: prints a code and waits
              qxfer pair laptop.local       # on the other: asks for that code
              qxfer send notes.txt laptop.local    # from then on, no fingerprint to check
              qxfer recv --paired-only      # and receivers can admit paired senders only

            docs/COMMANDS.md tells how the code is checked (SPAKE2) and what is stored; see \
            'qxfer devices' and 'qxfer unpair'.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("The waiting machine; omit it to be the waiting machine.", valueName: "host[:port]"))
    var destination: String?

    @Option(help: "The port to wait on (TCP and UDP), when waiting.")
    var port: UInt16 = defaultPairingPort

    @Option(help: "The address to wait on (default: all), when waiting.")
    var host: String?

    @Option(help: ArgumentHelp("The code: to use instead of a random one when waiting (for scripts), or the one shown by the waiting machine.", valueName: "code"))
    var code: String?

    @Option(help: ArgumentHelp("The name the other machine will know this one by (default: the host name).", valueName: "name"))
    var name: String?

    @Option(help: StackChoice.help)
    var stack: StackChoice = .auto

    @Option(help: ArgumentHelp("How long to wait for an attempt, in seconds.", valueName: "seconds"))
    var timeout: Int = 300

    func validate() throws {
        if let code, PairingCode(parsing: code) == nil {
            throw ValidationError("'\(code)' is not a pairing code: six digits")
        }
        if let name, !Pairing.isAcceptableName(name) {
            throw ValidationError("'\(name)' cannot be a device name: 1 to 64 bytes, no control characters")
        }
        guard timeout > 0 else { throw ValidationError("--timeout must be positive") }
    }

    func run() async throws {
        global.bootstrapLogging()
        try Pairing.checkAvailable()  // before any socket or prompt
        try await cancellingOnInterrupt {
            if let destination {
                try await initiate(to: destination)
            } else {
                try await wait()
            }
        }
    }

    private var deviceName: String { name ?? ReceiverDiscovery.defaultName }

    // MARK: The machine that connects

    private func initiate(to destination: String) async throws {
        let endpoint = try parseDestination(destination, defaultPort: defaultPairingPort)
        let code = try self.code.flatMap(PairingCode.init(parsing:)) ?? askForCode(shownOn: endpoint.host)
        let identity = try global.identity()
        let store = PairedDevices(in: global.config, identity: identity)
        _ = try store.devices()  // a damaged list stops us before the other side stores anything
        let device = try await stack.run(
            Initiating(endpoint: endpoint, code: code, name: deviceName, identity: identity, store: store),
            identity: identity, trust: .anyCertificate, config: global.config)
        report(device, store: store)
    }

    /// Pairing with the waiting side, over whichever stack `--stack` chose. Any certificate:
    /// the PAKE is what authenticates it, bound to the fingerprint seen here.
    private struct Initiating: OverChosenStack {
        let endpoint: Endpoint
        let code: PairingCode
        let name: String
        let identity: HostIdentity
        let store: PairedDevices

        func run<Transport: SecureTransport>(over transport: Transport) async throws -> PairedDevices.Device {
            let connection = NetworkConnection(to: endpoint, using: .parameters {
                Coder(PairingMessage.self, using: .json, maximumMessageSize: Pairing.maximumMessageSize) { transport }
            })
            // A closed port or no route fails in a second, as for send, not at the connect timeout.
            try await startFailingFast(connection)
            return try await Pairing.initiate(over: connection, code: code, name: name, address: endpoint.host, identity: identity, store: store)
        }
    }

    private func askForCode(shownOn host: String) throws -> PairingCode {
        guard isatty(STDIN_FILENO) == 1 else {
            throw ValidationError("no terminal to ask for the code on; pass --code")
        }
        StandardStream.error.write("Pairing code shown on \(host): ")
        guard let line = readLine(), let code = PairingCode(parsing: line) else {
            throw ValidationError("that is not a pairing code: six digits")
        }
        return code
    }

    // MARK: The machine that waits

    private func wait() async throws {
        let code = code.flatMap(PairingCode.init(parsing:)) ?? PairingCode.random()
        let identity = try global.identity()
        let store = PairedDevices(in: global.config, identity: identity)
        _ = try store.devices()
        let (results, finished) = AsyncStream.makeStream(of: Result<PairedDevices.Device, any Error>.self)
        let attempt = WaitingAttempt(code: code, name: deviceName, identity: identity, store: store, results: finished)

        let tls = NetworkListener(on: port, host: host, using: .parameters {
            Coder(PairingMessage.self, using: .json, maximumMessageSize: Pairing.maximumMessageSize) {
                TLS().identity(identity).clientAuthentication(.optional)
            }
        })
        let device = try await withThrowingTaskGroup(of: PairedDevices.Device?.self) { group in
            group.addTask {
                try await tls.run { try await attempt.handle($0) }
                return nil
            }
            let boundPort = try await tls.port
            let quic = NetworkListener(on: boundPort, host: host, using: .parameters {
                Coder(PairingMessage.self, using: .json, maximumMessageSize: Pairing.maximumMessageSize) {
                    QUIC().identity(identity).clientAuthentication(.optional)
                }
            })
            group.addTask {
                try await quic.run { try await attempt.handle($0) }
                return nil
            }
            _ = try await quic.port
            let seconds = timeout
            group.addTask {
                try await Task.sleep(for: .seconds(seconds))
                throw QXferError(.idleTimeout, "no pairing attempt within \(seconds) s; nothing was stored")
            }
            group.addTask {
                for await result in results { return try result.get() }
                return nil
            }
            StandardStream.error.write("""
                qxfer: pairing code  \(code)
                qxfer: on the other machine run:  qxfer pair \(displayHost(host)):\(boundPort)
                qxfer: waiting up to \(seconds) s for one attempt (this machine: '\(deviceName)', fingerprint \(identity.fingerprint))

                """)
            while let outcome = try await group.next() {
                if let outcome {
                    group.cancelAll()
                    return outcome
                }
            }
            throw QXferError(.connectionClosed, "the pairing listeners stopped")
        }
        report(device, store: store)
    }

    private func displayHost(_ host: String?) -> String {
        if let host, host != "0.0.0.0", host != "::" { return host.contains(":") ? "[\(host)]" : host }
        return localAddresses().first ?? ProcessInfo.processInfo.hostName
    }

    private func report(_ device: PairedDevices.Device, store: PairedDevices) {
        StandardStream.error.write(
            "qxfer: paired with '\(device.name)' (fingerprint \(device.fingerprint)); saved in \(store.path)\n")
    }
}

/// The one attempt a waiting `qxfer pair` allows per code: the first connection that sends a
/// pairing request takes it; later ones are told so. A connection that never sends one (a port
/// scan, a stray client) takes nothing.
final class WaitingAttempt: Sendable {
    let code: PairingCode
    let name: String
    let identity: HostIdentity
    let store: PairedDevices
    let results: AsyncStream<Result<PairedDevices.Device, any Error>>.Continuation
    private let taken = Mutex(false)

    init(code: PairingCode, name: String, identity: HostIdentity, store: PairedDevices,
         results: AsyncStream<Result<PairedDevices.Device, any Error>>.Continuation) {
        self.code = code
        self.name = name
        self.identity = identity
        self.store = store
        self.results = results
    }

    func handle<Stack: CoderStack>(_ connection: NetworkConnection<Stack>) async throws where Stack.Message == PairingMessage {
        let hello = try await Pairing.firstMessage(of: connection)
        let first = taken.withLock { taken in
            defer { taken = true }
            return !taken
        }
        guard first else {
            try? await connection.send(.refused(reason: "this code was already used; start 'qxfer pair' again for a new one"))
            return
        }
        do {
            results.yield(.success(try await Pairing.respond(to: hello, over: connection, code: code, name: name, identity: identity, store: store)))
        } catch {
            results.yield(.failure(error))
        }
    }
}

struct DevicesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "devices",
        abstract: "List the machines paired with 'qxfer pair'.",
        discussion: """
            EXAMPLES:
              qxfer devices
              qxfer devices --json           # an array of devices, for scripts
            """
    )

    @OptionGroup var global: LocalOptions

    @Flag(help: "Print JSON (an array of devices) on standard output.")
    var json = false

    func run() async throws {
        global.bootstrapLogging()
        let identity = try global.identity()
        let devices = try PairedDevices(in: global.config, identity: identity).devices()
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            encoder.dateEncodingStrategy = .iso8601
            encoder.keyEncodingStrategy = .convertToSnakeCase  // as every JSON event is: paired_at, last_seen
            StandardStream.output.write(String(decoding: try encoder.encode(devices), as: UTF8.self) + "\n")
            return
        }
        guard !devices.isEmpty else {
            StandardStream.output.write("no paired devices; pair one with 'qxfer pair'\n")
            return
        }
        for device in devices {
            StandardStream.output.writeVerbatim(TerminalText.escaped(device.name) + "\n")
            StandardStream.output.write("  fingerprint  \(device.fingerprint)\n")
            StandardStream.output.write("  paired       \(device.pairedAt.formatted(.iso8601))" + (device.address.map { " (at \($0))" } ?? "") + "\n")
            StandardStream.output.write("  last seen    \(device.lastSeen.map { $0.formatted(.iso8601) } ?? "not since pairing")\n")
        }
    }
}

struct UnpairCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unpair",
        abstract: "Forget a paired machine: it is trusted no more.",
        discussion: """
            EXAMPLES:
              qxfer unpair laptop            # by the name 'qxfer devices' lists
            """
    )

    @OptionGroup var global: LocalOptions

    @Argument(help: ArgumentHelp("The device's name or fingerprint, as 'qxfer devices' lists it.", valueName: "name|fingerprint"))
    var device: String

    func run() async throws {
        global.bootstrapLogging()
        let identity = try global.identity()
        let store = PairedDevices(in: global.config, identity: identity)
        let removed = try store.remove(device)
        guard !removed.isEmpty else {
            throw QXferError(.invalidUse, "no paired device is called or has the fingerprint '\(device)'; see 'qxfer devices'")
        }
        for device in removed {
            StandardStream.error.write("qxfer: unpaired '\(device.name)' (\(device.fingerprint))\n")
        }
    }
}
