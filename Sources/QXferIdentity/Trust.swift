@_spi(Stacks) import QXferCore

/// The trust settings that ``TLS`` and ``QUIC`` share, and the modifiers that set them.
public protocol SecureTransport: ByteStreamProtocol {
    /// The identity presented to the peer; nil loads or creates the host identity.
    var identity: HostIdentity? { get set }
    /// How a client decides whether to trust the server.
    var peerTrust: PeerTrust { get set }
    /// What a server asks of clients.
    var clientAuthentication: ClientAuthentication { get set }
}

extension SecureTransport {
    /// Presents this identity instead of the host identity.
    public func identity(_ identity: HostIdentity) -> Self { with { $0.identity = identity } }

    /// Trusts the server only if it presents a certificate with this fingerprint.
    public func peerFingerprint(_ fingerprint: Fingerprint) -> Self { peerTrust(.pinned(fingerprint)) }

    /// Sets how the server is authenticated.
    public func peerTrust(_ trust: PeerTrust) -> Self { with { $0.peerTrust = trust } }

    /// Sets what a listener asks of its clients.
    public func clientAuthentication(_ authentication: ClientAuthentication) -> Self {
        with { $0.clientAuthentication = authentication }
    }

    private func with(_ change: (inout Self) -> Void) -> Self {
        var copy = self
        change(&copy)
        return copy
    }
}


extension HostIdentity: Hashable {
    public static func == (lhs: HostIdentity, rhs: HostIdentity) -> Bool { lhs.fingerprint == rhs.fingerprint }
    public func hash(into hasher: inout Hasher) { hasher.combine(fingerprint) }
}

/// How a client decides to trust the server it reached.
public struct PeerTrust: Sendable, Hashable {
    @_spi(Stacks) public enum Kind: Sendable, Hashable {
        case pinned(Set<Fingerprint>)
        case knownHosts(KnownHosts, trustOnFirstUse: Bool)
        case pairedDevice(name: String, fingerprint: Fingerprint)
        case anyCertificate
    }
    @_spi(Stacks) public let kind: Kind
    /// Paired devices (fingerprint → name) admitted whatever the kind says, before known hosts.
    var pairedDevices: [Fingerprint: String] = [:]
    /// Where a pinned fingerprint, once verified, is recorded for a host that has no entry yet.
    var pinRecord: KnownHosts?

    /// Only a server presenting one of these certificate fingerprints.
    public static func pinned(_ fingerprints: Fingerprint...) -> PeerTrust {
        PeerTrust(kind: .pinned(Set(fingerprints)))
    }

    /// The fingerprint recorded for this host and port; on first contact, record what the
    /// server presents (trust on first use) unless `trustOnFirstUse` is false.
    public static func knownHosts(_ file: KnownHosts = KnownHosts(), trustOnFirstUse: Bool = true) -> PeerTrust {
        PeerTrust(kind: .knownHosts(file, trustOnFirstUse: trustOnFirstUse))
    }

    /// Only the device paired under `name` (`qxfer pair`): a different certificate is refused
    /// with both fingerprints, never trusted on first use.
    public static func pairedDevice(named name: String, fingerprint: Fingerprint) -> PeerTrust {
        PeerTrust(kind: .pairedDevice(name: name, fingerprint: fingerprint))
    }

    /// Any certificate: encrypts but does not authenticate. For tests and demos, and for
    /// protocols that authenticate the peer themselves (pairing's PAKE).
    public static let anyCertificate = PeerTrust(kind: .anyCertificate)

    /// Also records a pinned fingerprint in `file` once a handshake has verified it, if the host
    /// has no entry there yet: later connections that trust ``knownHosts(_:trustOnFirstUse:)``
    /// then verify against what the pin proved instead of trusting on first use. An existing
    /// entry is never changed, and a file that cannot be written does not fail the connection.
    public func recordingPin(in file: KnownHosts) -> PeerTrust {
        var copy = self
        copy.pinRecord = file
        return copy
    }

    /// Also admits a server presenting the certificate of one of these paired devices
    /// (fingerprint → name), reported as ``TrustDecision/paired(name:)``, without consulting
    /// or writing known hosts.
    public func admittingPairedDevices(_ devices: [Fingerprint: String]) -> PeerTrust {
        var copy = self
        copy.pairedDevices.merge(devices) { _, new in new }
        return copy
    }
}

/// What a listener asks of the clients that connect to it.
public struct ClientAuthentication: Sendable, Hashable {
    @_spi(Stacks) public enum Kind: Sendable, Hashable {
        case none
        case optional
        case required(Set<Fingerprint>, listName: String)
    }
    @_spi(Stacks) public let kind: Kind
    /// Paired devices (fingerprint → name): a client presenting one of their certificates is
    /// admitted as ``TrustDecision/paired(name:)`` where the kind admits it, not as
    /// unauthenticated or allow-listed (`recv -v` says who came, issue 62 §5).
    @_spi(Stacks) public var pairedDevices: [Fingerprint: String] = [:]

    init(kind: Kind) { self.kind = kind }

    /// Also names the clients presenting a paired device's certificate (fingerprint → name):
    /// they are reported as ``TrustDecision/paired(name:)``. Admits no one the kind refuses.
    public func recognizingPairedDevices(_ devices: [Fingerprint: String]) -> ClientAuthentication {
        var copy = self
        copy.pairedDevices.merge(devices) { _, new in new }
        return copy
    }

    /// Asks for no client certificate.
    public static let none = ClientAuthentication(kind: .none)
    /// Asks for a client certificate and reports its fingerprint, but admits clients without one.
    public static let optional = ClientAuthentication(kind: .optional)
    /// Admits only clients presenting a certificate whose fingerprint is in `allowed` (mutual TLS).
    public static func required(allowing allowed: some Sequence<Fingerprint>) -> ClientAuthentication {
        ClientAuthentication(kind: .required(Set(allowed), listName: "on the allow-list"))
    }

    /// Admits only clients whose certificate is one of the paired devices' (`recv --paired-only`);
    /// a refusal says the client is not paired.
    public static func pairedDevices(_ fingerprints: some Sequence<Fingerprint>) -> ClientAuthentication {
        ClientAuthentication(kind: .required(Set(fingerprints), listName: "a paired device (pair it first with 'qxfer pair')"))
    }
}
