@_spi(Stacks) import QXferCore

/// Decides, during the handshake, whether the peer's certificate is trusted, and remembers
/// why, so a refusal surfaces as a precise ``QXferError`` instead of a TLS alert code.
///
/// Runs on the event loop inside swift-nio-ssl's custom verification callback (TLS) or the
/// engine's GnuTLS callback (QUIC); the lock only hands the outcome to the task that awaits
/// the handshake.
@_spi(Stacks) public final class PeerVerifier: Sendable {
    @_spi(Stacks) public enum Role: Sendable {
        /// A client checking the server it reached at `hostKey` (`host:port`).
        case client(PeerTrust, hostKey: String)
        /// A listener checking a client.
        case server(ClientAuthentication)
    }

    @_spi(Stacks) public struct Outcome: Sendable {
        @_spi(Stacks) public var fingerprint: Fingerprint?
        @_spi(Stacks) public var trust: TrustDecision = .unauthenticated
        @_spi(Stacks) public var failure: QXferError?
        /// A first contact to write to known hosts once the handshake has fully succeeded.
        @_spi(Stacks) public var pendingFirstUse: (KnownHosts, String)?
        /// A verified pin to write to known hosts if the host has no entry, likewise.
        var pendingPin: (KnownHosts, String)?
    }

    @_spi(Stacks) public let role: Role
    private let outcome = Locked(Outcome())

    @_spi(Stacks) public init(_ role: Role) { self.role = role }

    @_spi(Stacks) public var result: Outcome { outcome.withLock { $0 } }

    /// Decides on a leaf certificate and records the outcome; true admits the peer.
    /// The QUIC engine calls this directly from its TLS callback.
    @_spi(Stacks) public func evaluate(certificateDER der: [UInt8]) -> Bool {
        let fingerprint = Fingerprint(certificateDER: der)
        // The fingerprint and the decision appear together: a reader in between (QUIC's early
        // data, logging its receiver) saw a fingerprint with no failure yet and called it trusted.
        switch decide(fingerprint) {
        case .success(let trust):
            outcome.withLock {
                $0.fingerprint = fingerprint
                $0.trust = trust
            }
            return true
        case .failure(let error):
            outcome.withLock {
                $0.fingerprint = fingerprint
                $0.failure = error
            }
            return false
        }
    }

    /// Decides on a fingerprint known before the handshake (the one a session ticket was
    /// issued under), without recording anything: the trust it would be given, or nil if it
    /// would be refused or is only a first contact. The certificate itself is still evaluated
    /// when the handshake completes.
    @_spi(Stacks) public func presumedTrust(for fingerprint: Fingerprint) -> TrustDecision? {
        guard case .success(let trust) = decide(fingerprint, recordsFirstUse: false) else { return nil }
        switch trust {
        case .pinned, .knownHost, .paired: return trust
        default: return nil
        }
    }

    /// Writes what the handshake decided to keep, once it has fully succeeded (ALPN included):
    /// a first contact, whose failure to be written fails the connection (it would be trusted
    /// again unrecorded next time), and a verified pin for a host with no entry, which is only
    /// a convenience and is written if it can be.
    @_spi(Stacks) public func recordAfterHandshake(peer fingerprint: Fingerprint?) throws {
        guard let fingerprint else { return }
        let result = self.result
        if let (file, key) = result.pendingFirstUse {
            do {
                try file.add(key, fingerprint)
            } catch {
                let reason = (error as? QXferError)?.message ?? "\(error)"
                throw QXferError(
                    .identity,
                    "cannot record the first contact with \(key) (fingerprint \(fingerprint)): \(reason); a first contact is "
                        + "trusted only once recorded: make \(file.path) writable, or pass --fingerprint \(fingerprint)")
            }
        }
        // Looked up again: a concurrent connection (the other stack of a race) may have written it.
        if let (file, key) = result.pendingPin, (try? file.lookup(key)) == .some(nil) {
            try? file.add(key, fingerprint)
        }
    }

    @_spi(Stacks) public func record(failure: QXferError) {
        outcome.withLock { $0.failure = failure }
    }

    private func decide(_ presented: Fingerprint, recordsFirstUse: Bool = true) -> Result<TrustDecision, QXferError> {
        switch role {
        case .client(let trust, let hostKey):
            if let name = trust.pairedDevices[presented] { return .success(.paired(name: name)) }
            switch trust.kind {
            case .anyCertificate:
                return .success(.unauthenticated)
            case .pairedDevice(let name, let fingerprint):
                if presented == fingerprint { return .success(.paired(name: name)) }
                return .failure(QXferError(
                    .fingerprintMismatch,
                    "REFUSED: \(hostKey) presented fingerprint \(presented), but it is paired as '\(name)' with "
                        + "\(fingerprint); someone may be intercepting the connection. If '\(name)' really has a new "
                        + "identity, run 'qxfer unpair \(name)' and pair again"))
            case .pinned(let pins):
                if pins.contains(presented) {
                    // Whether the host has an entry is looked up once, when writing (not here, in
                    // the handshake's callback on the event loop).
                    if recordsFirstUse, let file = trust.pinRecord { outcome.withLock { $0.pendingPin = (file, hostKey) } }
                    return .success(.pinned)
                }
                let expected = pins.map(\.description).sorted().joined(separator: " or ")
                return .failure(QXferError(
                    .fingerprintMismatch,
                    "REFUSED: \(hostKey) presented fingerprint \(presented), but \(expected) was pinned; "
                        + "someone may be intercepting the connection, or the receiver has a new identity"))
            case .knownHosts(let file, let trustOnFirstUse):
                let entry: KnownHosts.Entry?
                do { entry = try file.lookup(hostKey) } catch { return .failure(error as! QXferError) }
                if let entry {
                    if entry.fingerprint == presented { return .success(.knownHost) }
                    return .failure(QXferError(
                        .fingerprintMismatch,
                        "REFUSED: \(hostKey) presented fingerprint \(presented), but \(file.path) line \(entry.line) "
                            + "has \(entry.fingerprint); someone may be intercepting the connection. If the receiver "
                            + "really has a new identity, delete that line or pass --fingerprint \(presented)"))
                }
                guard trustOnFirstUse else {
                    return .failure(QXferError(
                        .untrustedPeer,
                        "\(hostKey) (fingerprint \(presented)) is not in \(file.path) and trust on first use is off"))
                }
                if recordsFirstUse { outcome.withLock { $0.pendingFirstUse = (file, hostKey) } }
                return .success(.firstUse(recordedIn: file.path))
            }
        case .server(let authentication):
            let paired = authentication.pairedDevices[presented]
            switch authentication.kind {
            case .none, .optional:
                return .success(paired.map { .paired(name: $0) } ?? .unauthenticated)
            case .required(let allowed, let listName):
                if allowed.contains(presented) { return .success(paired.map { .paired(name: $0) } ?? .allowListed) }
                return .failure(QXferError(
                    .untrustedPeer, "it is not \(listName)"))
            }
        }
    }
}
