import ArgumentParser
import FoundationEssentials
import Glibc
import PlainText
import QXfer
import QXferPairing
import QXferReach

/// What `send --code` and `recv CODE` share: where to meet, how the code is shown, how the
/// sender authenticates the receiver, and how the path is named in the summary.
enum CodeOptions {
    /// The relay named by `--relay`, else by `QXFER_RELAY`; with neither, the local network.
    static func meetingPlace(_ option: String?) throws(ValidationError) -> MeetingPlace {
        let named = option ?? ProcessInfo.processInfo.environment["QXFER_RELAY"].flatMap { $0.isEmpty ? nil : $0 }
        guard let named else { return .localNetwork }
        guard let relay = RelayAddress(parsing: named) else {
            throw ValidationError("'\(named)' is not a relay: host, host:port or [ipv6]:port" + (option == nil ? " (from QXFER_RELAY)" : ""))
        }
        return .relay(relay)
    }

    /// The code, as the other person needs it.
    static func announce(_ code: TransferCode, at place: MeetingPlace, json: Bool) {
        let relayPart: String
        switch place {
        case .relay(let relay): relayPart = ProcessInfo.processInfo.environment["QXFER_RELAY"] == relay.description ? "" : " --relay \(relay)"
        case .localNetwork: relayPart = ""
        }
        if json {
            Console.emit("code", ["code": code.description, "command": "qxfer recv \(code)\(relayPart)"])
        }
        StandardStream.error.write("code: \(code)\non the other machine run:  qxfer recv \(code)\(relayPart)\n")
        if case .localNetwork = place {
            StandardStream.error.write("(no relay named: the receiver must be on this network; across the internet use --relay or QXFER_RELAY)\n")
        }
    }

    /// The sender's authentication of the receiver, over whichever stack `--stack` chose.
    struct Authenticating: OverChosenStack {
        let meeting: CodeMeeting
        let identity: HostIdentity
        let store: PairedDevices?

        func run<Transport: SecureTransport>(over transport: Transport) async throws -> PairedDevices.Device {
            try await meeting.authenticatePeer(over: transport, identity: identity, name: ReceiverDiscovery.defaultName, store: store)
        }
    }

    /// The path as the summary names it.
    static func carried(_ report: PathReport) -> CarriedPath {
        let route: String
        switch report.route {
        case .direct: route = "direct"
        case .relayed: route = "relayed"
        }
        return CarriedPath(route: route, directBytes: report.directBytes, relayedBytes: report.relayedBytes + report.spliceBytes)
    }
}

/// The path a transfer by code took: `direct` or `relayed`, and the bytes (both directions,
/// packet headers included) that went each way.
struct CarriedPath: Sendable {
    let route: String
    let directBytes: UInt64
    let relayedBytes: UInt64

    var description: String {
        switch (directBytes > 0, relayedBytes > 0) {
        case (true, true): "path direct (\(TextFormat.bytes(directBytes)) direct, \(TextFormat.bytes(relayedBytes)) through the relay)"
        case (false, true): "through the relay"
        default: route == "direct" ? "on a direct path" : "through the relay"
        }
    }
}
