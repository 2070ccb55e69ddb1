import FoundationEssentials
import Glibc
import QXfer

/// How `send` and `stream send` authenticate the receiver, strongest evidence first:
/// an explicit `--fingerprint`; then a paired device reached at the address it was paired at
/// (or under its name, found on the local network), pinned with no trust on first use; then
/// known hosts, where any paired device's certificate is trusted as well. A pin, once verified,
/// is recorded in known hosts for a receiver that has no entry, so the next send there needs
/// no `--fingerprint` and is not a first contact (nor denied early data as one).
struct ReceiverTrust {
    let trust: PeerTrust
    let pairedDevices: PairedDevices
    /// The known-hosts file and key a verified pin is recorded under (nil: nothing to record).
    private let pinRecord: (file: KnownHosts, key: String)?

    init(fingerprint: String?, endpoint: Endpoint, discoveredName: String?, identity: HostIdentity, config: ConfigDirectory) throws {
        pairedDevices = PairedDevices(in: config, identity: identity)
        if let pinned = fingerprint.flatMap(Fingerprint.init(parsing:)) {
            let knownHosts = KnownHosts(in: config)
            let key = KnownHosts.key(host: endpoint.host, port: Int(endpoint.port))
            trust = PeerTrust.pinned(pinned).recordingPin(in: knownHosts)
            // Said once connected only if the host had no entry (the verifier writes none then).
            pinRecord = (try? knownHosts.lookup(key)) == .some(nil) ? (knownHosts, key) : nil
            return
        }
        pinRecord = nil
        let devices = try pairedDevices.devices()
        let host = endpoint.host.lowercased()
        if let device = devices.last(where: { $0.address?.lowercased() == host || $0.name == discoveredName }) {
            trust = .pairedDevice(named: device.name, fingerprint: device.fingerprint)
        } else {
            trust = PeerTrust.knownHosts(KnownHosts(in: config))
                .admittingPairedDevices(Dictionary(devices.map { ($0.fingerprint, $0.name) }) { _, last in last })
        }
    }

    /// A receiver authenticated by a transfer code: pinned to the fingerprint the code's
    /// exchange proved, recorded nowhere (its address is a local port of this run).
    init(authenticatedByCode fingerprint: Fingerprint, identity: HostIdentity, config: ConfigDirectory) {
        pairedDevices = PairedDevices(in: config, identity: identity)
        trust = .pinned(fingerprint)
        pinRecord = nil
    }

    /// Records "last seen" for a paired receiver once connected; a failure to write it is
    /// not worth failing a transfer for.
    func connected(to peer: PeerIdentity?) {
        guard case .paired = peer?.trust, let fingerprint = peer?.fingerprint else { return }
        try? pairedDevices.markSeen(fingerprint)
    }

    /// What `send` and `stream send` say once connected about a receiver met for the first
    /// time: trusted on first use, or its verified pin now recorded (nil otherwise).
    func notice(_ endpoint: Endpoint, _ peer: PeerIdentity?) -> String? {
        guard let peer, let fingerprint = peer.fingerprint else { return nil }
        switch peer.trust {
        case .firstUse(let file):
            return "first contact with \(endpoint): trusting its fingerprint \(fingerprint) and recording it in \(file); "
                + "compare it with 'qxfer id' on the receiver"
        case .pinned:
            guard let pinRecord, (try? pinRecord.file.lookup(pinRecord.key))??.fingerprint == fingerprint else { return nil }
            return "recorded \(endpoint)'s pinned fingerprint in \(pinRecord.file.path): later sends there need no --fingerprint"
        default:
            return nil
        }
    }
}
