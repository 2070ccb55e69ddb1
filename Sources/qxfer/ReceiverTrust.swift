import FoundationEssentials
import Glibc
import QXfer

/// How `send` and `stream send` authenticate the receiver, strongest evidence first:
/// an explicit `--fingerprint`; then a paired device reached at the address it was paired at
/// (or under its name, found on the local network), pinned with no trust on first use; then
/// known hosts, where any paired device's certificate is trusted as well.
struct ReceiverTrust {
    let trust: PeerTrust
    let pairedDevices: PairedDevices

    init(fingerprint: String?, endpoint: Endpoint, discoveredName: String?, identity: HostIdentity, config: ConfigDirectory) throws {
        pairedDevices = PairedDevices(in: config, identity: identity)
        if let pinned = fingerprint.flatMap(Fingerprint.init(parsing:)) {
            trust = .pinned(pinned)
            return
        }
        let devices = try pairedDevices.devices()
        let host = endpoint.host.lowercased()
        if let device = devices.last(where: { $0.address?.lowercased() == host || $0.name == discoveredName }) {
            trust = .pairedDevice(named: device.name, fingerprint: device.fingerprint)
        } else {
            trust = PeerTrust.knownHosts(KnownHosts(in: config))
                .admittingPairedDevices(Dictionary(devices.map { ($0.fingerprint, $0.name) }) { _, last in last })
        }
    }

    /// Records "last seen" for a paired receiver once connected; a failure to write it is
    /// not worth failing a transfer for.
    func connected(to peer: PeerIdentity?) {
        guard case .paired = peer?.trust, let fingerprint = peer?.fingerprint else { return }
        try? pairedDevices.markSeen(fingerprint)
    }
}

/// What `send` and `stream send` say on first contact with a receiver (nil otherwise).
func firstContactNotice(_ endpoint: Endpoint, _ peer: PeerIdentity?) -> String? {
    guard case .firstUse(let file) = peer?.trust, let fingerprint = peer?.fingerprint else { return nil }
    return "first contact with \(endpoint): trusting its fingerprint \(fingerprint) and recording it in \(file); compare it with 'qxfer id' on the receiver"
}
