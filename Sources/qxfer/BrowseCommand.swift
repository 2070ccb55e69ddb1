import ArgumentParser
import Dispatch
import FoundationEssentials
import Glibc
import PlainText
import Logging
import QXfer

struct BrowseCommand: AsyncParsableCommand, JSONOutput {
    static let configuration = CommandConfiguration(
        commandName: "browse",
        abstract: "List receivers on the local network as they appear and disappear.",
        discussion: """
            EXAMPLES:
              qxfer browse                   # '+' as a receiver appears, '-' as it leaves
              qxfer browse --timeout 5 --json
              qxfer browse --interface eth0

            The fingerprint shown is a hint, never trusted as such. docs/COMMANDS.md and \
            docs/DISCOVERY.md tell more.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Flag(help: "Print one JSON object per line: event (added, changed, removed), name, host, addresses, port, fingerprint, txt.")
    var json = false

    @Option(help: ArgumentHelp("The DNS-SD service type to browse for.", valueName: "type"))
    var type = ReceiverDiscovery.serviceType

    @Option(name: .customLong("interface"), help: ArgumentHelp("Browse only on this interface (repeatable). Default: every interface that is up with multicast.", valueName: "name"))
    var interfaces: [String] = []

    @Option(help: ArgumentHelp("Stop after this many seconds. Default: until interrupted.", valueName: "seconds"))
    var timeout: Double?

    func validate() throws {
        if let timeout, !(timeout > 0) { throw ValidationError("--timeout must be a positive number of seconds") }
        let parts = type.split(separator: ".")
        guard parts.count == 2, parts.allSatisfy({ $0.hasPrefix("_") && $0.count > 1 }), ["_udp", "_tcp"].contains(parts[1]) else {
            throw ValidationError("--type must look like _name._udp or _name._tcp")
        }
    }

    func run() async throws {
        global.bootstrapLogging()
        let browser = NetworkBrowser(for: .dnssd(type: type), interfaces: interfaces.isEmpty ? nil : interfaces)
        let json = self.json
        let limit = timeout.map { Duration.milliseconds(Int64($0 * 1000)) }
        try await cancellingOnInterrupt {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    var shown: [String: DiscoveredService] = [:]
                    _ = try await browser.run { endpoints in
                        let services = endpoints.compactMap(\.service)
                        for line in BrowseCommand.changes(from: shown, to: services, json: json) { BrowseCommand.write(line) }
                        shown = Dictionary(services.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
                        return .continue
                    }
                }
                if let limit {
                    group.addTask { try await Task.sleep(for: limit) }
                }
                // The first child to end (the timer, or the browser failing) ends the command.
                defer { group.cancelAll() }
                do {
                    try await group.next()
                } catch is CancellationError {}
            }
        }
    }

    /// The lines describing how the set of services changed.
    static func changes(from old: [String: DiscoveredService], to new: [DiscoveredService], json: Bool) -> [String] {
        var lines: [String] = []
        let newNames = Set(new.map(\.name))
        for (name, service) in old.sorted(by: { $0.key < $1.key }) where !newNames.contains(name) {
            lines.append(line(for: service, event: "removed", json: json))
        }
        for service in new {
            switch old[service.name] {
            case nil: lines.append(line(for: service, event: "added", json: json))
            case let previous? where previous != service: lines.append(line(for: service, event: "changed", json: json))
            default: break
            }
        }
        return lines
    }

    static func line(for service: DiscoveredService, event: String, json: Bool) -> String {
        let fingerprint = service.txt[ReceiverDiscovery.fingerprintKey]
        if json {
            var txt: [String: Any] = [:]
            for entry in service.txt.entries { txt[entry.key] = entry.value ?? JSONText.null }
            return Console.jsonLine(event, [
                "name": service.name, "type": service.type, "host": service.hostName, "addresses": service.addresses,
                "port": Int(service.port), "txt": txt, "fingerprint": fingerprint ?? JSONText.null,
            ])
        }
        if event == "removed" { return "- \(service.name)" }
        let addresses = service.addresses.joined(separator: ", ")
        return "+ \(service.name)  \(addresses)  port \(service.port)" + (fingerprint.map { "  fingerprint \($0)" } ?? "")
    }

    /// Unbuffered: a script reading the pipe sees each line as it happens. One line: a name
    /// from the network cannot start another.
    static func write(_ line: String) {
        StandardStream.output.writeVerbatim(TerminalText.escaped(line) + "\n")
    }
}

/// How qxfer receivers are found on the local network: the pieces `recv` and `send` share.
///
/// A receiver advertises `_qxfer._udp` with its instance name (the host name or `--name`),
/// its port, and TXT `fp=<sha256 fingerprint>` and `txtvers=1`. The fingerprint is a hint
/// for display and for choosing; it never replaces pinning or known hosts.
enum ReceiverDiscovery {
    static let serviceType = "_qxfer._udp"
    static let fingerprintKey = "fp"

    /// The instance name a receiver uses when none is given: the machine's host name.
    static var defaultName: String {
        ProcessInfo.processInfo.hostName.split(separator: ".").first.map(String.init) ?? "qxfer"
    }

    /// The service a receiver advertises.
    static func service(name: String?, port: UInt16, fingerprint: Fingerprint) -> DNSSDService {
        DNSSDService(
            name: name ?? defaultName, type: serviceType, port: port,
            txt: TXTRecord([.init(key: "txtvers", value: "1"), .init(key: fingerprintKey, value: fingerprint.description)]))
    }

    /// Advertises this receiver for as long as the calling task runs; returns once the task is
    /// cancelled, after the goodbye is sent. Never throws: a receiver works without discovery,
    /// so a failure to advertise is reported on standard error and the call waits for
    /// cancellation anyway.
    ///
    /// - Parameter registered: Hears the name actually advertised (it differs from `name` after
    ///   a conflict: "office-pc (2)").
    static func advertise(
        name: String?, port: UInt16, fingerprint: Fingerprint, interfaces: [String]? = nil,
        registered: @escaping @Sendable (String) async -> Void = { _ in }
    ) async {
        let advertiser = NetworkAdvertiser(service(name: name, port: port, fingerprint: fingerprint), interfaces: interfaces)
        do {
            try await advertiser.run(registered: registered)
        } catch {
            Console.warn("not advertising on the local network: \(error)")
            while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
        }
    }

    /// Runs `body` while advertising this receiver; the advertisement ends (with a goodbye)
    /// when `body` returns or throws.
    static func withAdvertisement<T: Sendable>(
        name: String?, port: UInt16, fingerprint: Fingerprint, interfaces: [String]? = nil,
        registered: @escaping @Sendable (String) async -> Void = { _ in },
        _ body: () async throws -> T
    ) async throws -> T {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await advertise(name: name, port: port, fingerprint: fingerprint, interfaces: interfaces, registered: registered) }
            defer { group.cancelAll() }
            return try await body()
        }
    }

    /// A receiver found on the local network.
    struct Found: Sendable {
        /// Connects like any endpoint (its first address, IPv4 preferred, and its port).
        var endpoint: Endpoint
        /// The advertised instance name.
        var name: String
        /// The fingerprint it advertises: a hint to show or compare, not a pin.
        var advertisedFingerprint: Fingerprint?
    }

    /// Finds the receiver called `name` (as soon as it answers), or with no name the only one
    /// that answers within `timeout`.
    ///
    /// - Throws: `QXferError` `service-not-found` when none (or none of that name)
    ///   answers, `ambiguous-service` when several answer and no name was given;
    ///   the message lists the receivers seen.
    static func resolve(name: String?, timeout: Duration = .seconds(3), interfaces: [String]? = nil) async throws -> Found {
        let browser = NetworkBrowser(for: .dnssd(type: serviceType), interfaces: interfaces)
        let logger = Logger(label: "qxfer.discovery")
        logger.info("asking the local network for \(name.map { "the receiver '\($0)'" } ?? "receivers") (\(serviceType), multicast DNS)")
        do {
            let endpoint = try await browser.resolve(named: name, timeout: timeout)
            let service = endpoint.service
            logger.info("found \(service?.description ?? endpoint.description) at \(endpoint)")
            return Found(
                endpoint: endpoint, name: service?.name ?? endpoint.host,
                advertisedFingerprint: service?.txt[fingerprintKey].flatMap { Fingerprint(parsing: $0) })
        } catch let error as QXferError where error.code == .ambiguousService {
            throw QXferError(.ambiguousService, error.message.replacing("choose one by name", with: "choose one with --to NAME"))
        } catch let error as QXferError where error.code == .serviceNotFound && name == nil {
            throw QXferError(
                .serviceNotFound,
                "no qxfer receiver found on the local network (no answer to a multicast DNS query for \(serviceType) "
                    + "within \(TextFormat.shortest(timeout.seconds)) s): start 'qxfer recv' there, or name the host: qxfer send FILE… HOST")
        }
    }
}
