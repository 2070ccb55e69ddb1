import ArgumentParser
import FoundationEssentials
import PlainText
import QXferReach

struct RelayCommand: AsyncParsableCommand, JSONOutput {
    static let configuration = CommandConfiguration(
        commandName: "relay",
        abstract: "Run a relay that lets two machines behind NATs meet by a transfer code.",
        discussion: """
            EXAMPLES:
              qxfer relay                        # port \(RelayServer.defaultPort), TCP and UDP, every address
              qxfer relay --port 7000 --host 192.0.2.10
              qxfer relay --json > relay.jsonl   # one JSON event per line
              qxfer relay --max-rooms-per-address 4 --allowance 256

            It holds no secret and sees only rooms (hashes), addresses and ciphertext. docs/RELAY.md \
            tells the limits, a systemd unit and what it reports.
            """
    )

    @Flag(help: "Print one JSON object per line: relay-listening, then relay-statistics every period.")
    var json = false

    @Option(help: ArgumentHelp("The port for TCP and UDP alike; 0 picks a free one.", valueName: "port"))
    var port: UInt16 = RelayServer.defaultPort

    @Option(help: ArgumentHelp("The address to listen on. Default: every address, IPv6 and IPv4.", valueName: "address"))
    var host: String?

    @Option(help: ArgumentHelp("Rooms one client address may hold open at once (IPv6: per /64).", valueName: "n"))
    var maxRoomsPerAddress = RelayLimits.default.maximumRoomsPerAddress

    @Option(help: ArgumentHelp("Rooms open at once on the whole relay.", valueName: "n"))
    var maxRooms = RelayLimits.default.maximumRooms

    @Option(help: ArgumentHelp("MiB each client address may have relayed at full speed; 0 relays without counting.", valueName: "MiB"))
    var allowance = RelayAllowance.default.burst >> 20

    @Option(help: ArgumentHelp("MiB per second an address's allowance refills at once spent.", valueName: "MiB/s"))
    var allowanceRate = RelayAllowance.default.bytesPerSecond >> 20

    @Option(help: ArgumentHelp("Seconds between statistics lines.", valueName: "seconds"))
    var statisticsEvery = 10

    func validate() throws {
        if maxRoomsPerAddress < 1 { throw ValidationError("--max-rooms-per-address must be at least 1") }
        if maxRooms < 1 { throw ValidationError("--max-rooms must be at least 1") }
        if allowance < 0 || allowance > 1 << 30 { throw ValidationError("--allowance must be 0 (unmetered) to 1073741824 MiB") }
        if allowanceRate < 1 || allowanceRate > 1 << 30 { throw ValidationError("--allowance-rate must be 1 to 1073741824 MiB/s") }
        if statisticsEvery < 1 || statisticsEvery > 86_400 { throw ValidationError("--statistics-every must be 1 to 86400 seconds") }
        if let host, host.isEmpty { throw ValidationError("--host must name an address") }
    }

    var limits: RelayLimits {
        var limits = RelayLimits.default
        limits.maximumRoomsPerAddress = maxRoomsPerAddress
        limits.maximumRooms = maxRooms
        limits.allowance = allowance == 0 ? nil : RelayAllowance(burst: allowance << 20, bytesPerSecond: allowanceRate << 20)
        return limits
    }

    func run() async throws {
        let server = RelayServer(host: host, port: port, limits: limits)
        let json = self.json
        let period = Duration.seconds(statisticsEvery)
        let host = self.host
        try await cancellingOnInterrupt {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    try await server.run { port in
                        if json {
                            Console.emit("relay-listening", ["port": Int(port), "host": host ?? JSONText.null])
                        } else {
                            RelayCommand.say("relay: listening on \(port) (TCP and UDP)" + (host.map { " at \($0)" } ?? ""))
                        }
                    }
                }
                group.addTask {
                    while true {
                        try await Task.sleep(for: period)
                        RelayCommand.report(server.statistics, json: json)
                    }
                }
                // The server ends only when cancelled or when its socket fails; either ends the command.
                defer { group.cancelAll() }
                try await group.next()
            }
        }
    }

    /// One statistics line, or event.
    static func report(_ statistics: RelayStatistics, json: Bool) {
        if json {
            Console.emit("relay-statistics", [
                "roomsOpen": statistics.roomsOpen, "roomsPaired": statistics.roomsPaired,
                "pairsServed": statistics.pairsServed, "connectionsOpen": statistics.connectionsOpen,
                "splicesServed": statistics.splicesServed, "bytesRelayed": statistics.bytesRelayed,
                "bytesRelayedUDP": statistics.bytesRelayedOverUDP, "bytesRelayedTCP": statistics.bytesRelayedOverTCP,
                "datagramsRelayed": statistics.datagramsRelayed, "datagramsDropped": statistics.datagramsDropped,
                "refusals": statistics.refusals,
            ])
            return
        }
        say("relay: \(statistics.roomsOpen) rooms open (\(statistics.roomsPaired) paired), \(statistics.pairsServed) pairs served, "
            + "\(TextFormat.bytes(UInt64(max(statistics.bytesRelayed, 0)))) relayed "
            + "(UDP \(TextFormat.bytes(UInt64(max(statistics.bytesRelayedOverUDP, 0)))), TCP \(TextFormat.bytes(UInt64(max(statistics.bytesRelayedOverTCP, 0))))), "
            + "\(statistics.datagramsDropped) datagrams dropped, \(statistics.refusals) refusals, \(statistics.connectionsOpen) connections")
    }

    /// A log line on standard output, where a service manager collects it.
    static func say(_ line: String) {
        StandardStream.output.write(line + "\n")
    }
}
