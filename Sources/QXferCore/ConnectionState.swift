/// Where a connection is in its life.
///
/// `preparing → ready`, with `waiting` while the path is unavailable and a retry is
/// scheduled; `failed` and `cancelled` are final.
public enum ConnectionState: Sendable, CustomStringConvertible {
    /// Resolving, connecting and handshaking.
    case preparing
    /// Established: sends and receives proceed.
    case ready
    /// The last attempt failed for a reason that may pass (refused, unreachable); retrying.
    case waiting(QXferError)
    /// Failed for good.
    case failed(QXferError)
    /// Closed by its owner.
    case cancelled

    public var description: String {
        switch self {
        case .preparing: "preparing"
        case .ready: "ready"
        case .waiting(let error): "waiting (\(error))"
        case .failed(let error): "failed (\(error))"
        case .cancelled: "cancelled"
        }
    }

    var isFinal: Bool {
        switch self {
        case .failed, .cancelled: true
        default: false
        }
    }
}

/// Who is on the other end of an established connection and why we believe it.
public struct PeerIdentity: Sendable, Hashable {
    /// The SHA-256 fingerprint of the certificate the peer presented; nil if it presented none
    /// (a client, to a listener that does not require one).
    public let fingerprint: Fingerprint?
    /// Why the peer was admitted.
    public let trust: TrustDecision
    /// The negotiated application protocol (ALPN).
    public let applicationProtocol: String

    @_spi(Stacks) public init(fingerprint: Fingerprint?, trust: TrustDecision, applicationProtocol: String) {
        self.fingerprint = fingerprint
        self.trust = trust
        self.applicationProtocol = applicationProtocol
    }
}

/// Why a peer was admitted.
public enum TrustDecision: Sendable, Hashable, CustomStringConvertible {
    /// Its fingerprint matched the one pinned explicitly.
    case pinned
    /// Its fingerprint matched the known-hosts entry.
    case knownHost
    /// First contact: its fingerprint has just been recorded in the known-hosts file at this path.
    case firstUse(recordedIn: String)
    /// A client whose fingerprint is on the listener's allow-list.
    case allowListed
    /// A device paired with `qxfer pair`, under this name.
    case paired(name: String)
    /// Not authenticated (`PeerTrust.anyCertificate`, or a client admitted without a
    /// required certificate); the channel is encrypted nonetheless.
    case unauthenticated

    /// For logs: "known host", "first use (recorded in …)".
    public var description: String {
        switch self {
        case .pinned: "pinned fingerprint"
        case .knownHost: "known host"
        case .firstUse(let file): "first use (recorded in \(file))"
        case .allowListed: "allow-listed"
        case .paired(let name): "paired device '\(name)'"
        case .unauthenticated: "unauthenticated"
        }
    }
}
