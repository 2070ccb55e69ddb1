/// The IP layer's options.
public struct IP: Sendable, Hashable {
    /// Whether IP may fragment packets (`IP_MTU_DISCOVER`); nil leaves the system default.
    public var allowsFragmentation: Bool?

    public init() {}

    /// Lets the network fragment packets (`true`), or sets Don't Fragment and uses path MTU
    /// discovery (`false`).
    public func fragmentationEnabled(_ enabled: Bool) -> IP {
        var copy = self
        copy.allowsFragmentation = enabled
        return copy
    }
}

/// The TCP layer's options.
public struct TCP: Sendable, Hashable {
    /// Options of the IP layer below.
    public var ip: IP
    /// `TCP_NODELAY`: send small writes at once; nil follows the performance mode.
    public var noDelay: Bool?
    /// TCP keepalive probing; nil leaves it off.
    public var keepAlive: KeepAlive?
    /// `TCP_USER_TIMEOUT`: how long sent data (or keepalive probes) may go unacknowledged
    /// before the connection fails; nil leaves the kernel's default (retransmissions for
    /// about 15 minutes).
    public var userTimeout: Duration?

    /// TCP keepalive timing.
    public struct KeepAlive: Sendable, Hashable {
        public var idle: Duration
        public var interval: Duration
        public var count: Int
        public init(idle: Duration = .seconds(15), interval: Duration = .seconds(5), count: Int = 4) {
            self.idle = idle
            self.interval = interval
            self.count = count
        }
    }

    public init() { self.ip = IP() }

    public init(@NetworkStackBuilder _ content: () -> IP) { self.ip = content() }

    /// Sets `TCP_NODELAY`.
    public func noDelay(_ enabled: Bool = true) -> TCP {
        var copy = self
        copy.noDelay = enabled
        return copy
    }

    /// Turns on keepalive probes, so a vanished peer is noticed on an otherwise idle connection.
    public func keepAlive(_ keepAlive: KeepAlive = KeepAlive()) -> TCP {
        var copy = self
        copy.keepAlive = keepAlive
        return copy
    }

    /// Fails the connection when what it sent (data or keepalive probes) stays unacknowledged
    /// for `timeout`: a peer cut off is noticed in that time rather than after the kernel's
    /// quarter of an hour of retransmissions (`TCP_USER_TIMEOUT`).
    public func userTimeout(_ timeout: Duration?) -> TCP {
        var copy = self
        copy.userTimeout = timeout
        return copy
    }
}

/// TLS 1.3 over TCP: qxfer's first transport.
///
/// Both sides present their ``HostIdentity``; the client checks the server against
/// ``PeerTrust`` (a pinned fingerprint, or known hosts with trust on first use) and the
/// server may require a client certificate from an allow-list (mutual TLS). ALPN `qxfer/1`
/// is required on both sides.
public struct TLS: Hashable, ByteStreamProtocol {
    /// Options of the TCP layer below.
    public var tcp: TCP
    /// Application protocols offered (client) or accepted (server); one must match.
    public var applicationProtocols: [String] = ["qxfer/1"]
    /// The identity presented to the peer; nil loads or creates the host identity.
    public var identity: HostIdentity?
    /// How a client decides whether to trust the server.
    public var peerTrust: PeerTrust = .knownHosts()
    /// What a server asks of clients.
    public var clientAuthentication: ClientAuthentication = .optional

    public init() { self.tcp = TCP() }

    public init(@NetworkStackBuilder _ content: () -> TCP) { self.tcp = content() }

    public var transport: TransportDescription { TransportDescription(kind: .tls(self)) }

    /// Sets the ALPN protocols (default `qxfer/1`).
    public func applicationProtocols(_ protocols: [String]) -> TLS {
        var copy = self
        copy.applicationProtocols = protocols
        return copy
    }
}

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

extension TLS: SecureTransport {}

extension HostIdentity: Hashable {
    public static func == (lhs: HostIdentity, rhs: HostIdentity) -> Bool { lhs.fingerprint == rhs.fingerprint }
    public func hash(into hasher: inout Hasher) { hasher.combine(fingerprint) }
}

/// How a client decides to trust the server it reached.
public struct PeerTrust: Sendable, Hashable {
    enum Kind: Sendable, Hashable {
        case pinned(Set<Fingerprint>)
        case knownHosts(KnownHosts, trustOnFirstUse: Bool)
        case pairedDevice(name: String, fingerprint: Fingerprint)
        case anyCertificate
    }
    let kind: Kind
    /// Paired devices (fingerprint → name) admitted whatever the kind says, before known hosts.
    var pairedDevices: [Fingerprint: String] = [:]

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
    enum Kind: Sendable, Hashable {
        case none
        case optional
        case required(Set<Fingerprint>, listName: String)
    }
    let kind: Kind

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
