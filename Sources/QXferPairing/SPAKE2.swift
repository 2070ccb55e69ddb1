import PairingGroup
import Crypto
import FoundationEssentials
import Glibc

/// SPAKE2 over P-256 with SHA-256, HKDF and HMAC (RFC 9382, "SPAKE2-P256-SHA256-HKDF-HMAC"):
/// two parties that share a low-entropy password derive a strong key, and each learns whether
/// the other knew the password. A passive eavesdropper learns nothing about the password; an
/// active attacker tests one guess per run, and cannot test guesses offline afterwards.
///
/// Sans-IO: ``start()`` gives the share to send, ``finish(peerShare:)`` the key confirmation to
/// send, ``verify(peerConfirmation:)`` whether the peer knew the password. Group arithmetic is
/// OpenSSL's (constant time on P-256); this type is the RFC's transcript and key schedule.
public struct SPAKE2: Sendable {
    /// Which side of the exchange this party is: `a` sends pA = x*G + w*M, `b` sends pB = y*G + w*N.
    public enum Role: Sendable { case a, b }

    public enum Failure: Error, Equatable, Sendable {
        /// The peer's share is not a valid point of the group (or the exchange degenerated).
        case invalidShare
        /// The peer's key confirmation does not match: it used another password, or someone in
        /// between changed the messages.
        case confirmationMismatch
        /// Methods called out of order.
        case misuse
    }

    /// The RFC's fixed points M and N for P-256 (compressed, RFC 9382 section 6).
    static let pointM = decompressed("02886e2f97ace46e55ba9dd7242579f2993b64e16ef3dcab95afd497333d8fa12f")
    static let pointN = decompressed("03d8bbd6c639c62937b04d997f38c3770719c629d7014d49a24b4f98baa1292b49")

    public let role: Role
    private let w: [UInt8]
    private let secret: [UInt8]
    private let identityA: [UInt8]
    private let identityB: [UInt8]
    private var ownShare: [UInt8]?
    private var keys: (shared: [UInt8], ownConfirmation: [UInt8], peerConfirmation: [UInt8])?

    /// A party with the password scalar `w` (see ``passwordScalar(_:domain:)``) and the two
    /// parties' identities as both agree on them.
    public init(role: Role, w: [UInt8], identityA: [UInt8], identityB: [UInt8]) throws {
        guard let secret = P256Group.randomScalar() else { throw Failure.misuse }
        try self.init(role: role, w: w, secret: secret, identityA: identityA, identityB: identityB)
    }

    /// The same with a chosen secret scalar: only for the RFC's test vectors.
    init(role: Role, w: [UInt8], secret: [UInt8], identityA: [UInt8], identityB: [UInt8]) throws {
        guard w.count == P256Group.scalarBytes, secret.count == P256Group.scalarBytes else { throw Failure.misuse }
        self.role = role
        self.w = w
        self.secret = secret
        self.identityA = identityA
        self.identityB = identityB
    }

    /// w from a password: SHA-512 of a domain label and the password, reduced modulo the group
    /// order (64 bytes for a 32-byte order keeps the bias below 2^-256, as RFC 9382 asks).
    public static func passwordScalar(_ password: some DataProtocol, domain: String) -> [UInt8] {
        var hash = SHA512()
        hash.update(data: Array(domain.utf8) + [0])
        hash.update(data: Array(password))
        let wide = Array(hash.finalize())
        guard let w = P256Group.reduce(wide) else { preconditionFailure("P-256 reduction cannot fail on 64 bytes") }
        return w
    }

    /// This party's share, 65 bytes, to send to the peer.
    public mutating func start() throws -> [UInt8] {
        guard let share = P256Group.share(scalar: secret, w: w, base: role == .a ? Self.pointM : Self.pointN) else {
            throw Failure.misuse
        }
        ownShare = share
        return share
    }

    /// Takes the peer's share and the additional data both sides bind into the key
    /// confirmation (RFC 9382's AAD); returns this party's key confirmation (32 bytes) to send.
    public mutating func finish(peerShare: [UInt8], additionalData: [UInt8] = []) throws -> [UInt8] {
        guard let ownShare, keys == nil else { throw Failure.misuse }
        guard peerShare.count == P256Group.pointBytes, peerShare != ownShare else { throw Failure.invalidShare }
        // K = secret * (peerShare - w * (the peer's base point)).
        guard let sharedPoint = P256Group.sharedPoint(
            scalar: secret, w: w, base: role == .a ? Self.pointN : Self.pointM, peer: peerShare) else {
            throw Failure.invalidShare
        }
        let (pA, pB) = role == .a ? (ownShare, peerShare) : (peerShare, ownShare)
        let schedule = Self.keySchedule(
            identityA: identityA, identityB: identityB, pA: pA, pB: pB, sharedPoint: sharedPoint, w: w,
            additionalData: additionalData)
        keys = role == .a
            ? (schedule.ke, schedule.confirmationA, schedule.confirmationB)
            : (schedule.ke, schedule.confirmationB, schedule.confirmationA)
        return keys!.ownConfirmation
    }

    /// Checks the peer's key confirmation; on success returns the shared key Ke (16 bytes).
    public func verify(peerConfirmation: [UInt8]) throws -> [UInt8] {
        guard let keys else { throw Failure.misuse }
        guard Self.constantTimeEqual(peerConfirmation, keys.peerConfirmation) else { throw Failure.confirmationMismatch }
        return keys.shared
    }

    struct Schedule {
        var ke: [UInt8]
        var confirmationA: [UInt8]
        var confirmationB: [UInt8]
    }

    /// RFC 9382 section 4: TT = len(A)||A||len(B)||B||len(pA)||pA||len(pB)||pB||len(K)||K||len(w)||w
    /// with 8-byte little-endian lengths; Ke||Ka = Hash(TT); KcA||KcB = HKDF(Ka, "ConfirmationKeys"||AAD);
    /// cA = HMAC(KcA, TT), cB = HMAC(KcB, TT).
    static func keySchedule(
        identityA: [UInt8], identityB: [UInt8], pA: [UInt8], pB: [UInt8], sharedPoint: [UInt8], w: [UInt8],
        additionalData: [UInt8]
    ) -> Schedule {
        var transcript: [UInt8] = []
        for field in [identityA, identityB, pA, pB, sharedPoint, w] {
            withUnsafeBytes(of: UInt64(field.count).littleEndian) { transcript += $0 }
            transcript += field
        }
        let digest = Array(SHA256.hash(data: transcript))
        let ke = Array(digest[0..<16]), ka = Array(digest[16..<32])
        let confirmationKeys = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: ka), info: Array("ConfirmationKeys".utf8) + additionalData, outputByteCount: 32)
        let (kcA, kcB) = confirmationKeys.withUnsafeBytes { (Array($0[0..<16]), Array($0[16..<32])) }
        return Schedule(
            ke: ke,
            confirmationA: Array(HMAC<SHA256>.authenticationCode(for: transcript, using: SymmetricKey(data: kcA))),
            confirmationB: Array(HMAC<SHA256>.authenticationCode(for: transcript, using: SymmetricKey(data: kcB))))
    }

    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for index in a.indices { difference |= a[index] ^ b[index] }
        return difference == 0
    }

    private static func decompressed(_ hex: String) -> [UInt8] {
        let compressed = stride(from: 0, to: hex.count, by: 2).map {
            UInt8(hex[hex.index(hex.startIndex, offsetBy: $0)..<hex.index(hex.startIndex, offsetBy: $0 + 2)], radix: 16)!
        }
        guard let point = P256Group.decompress(compressed) else { preconditionFailure("RFC 9382 constant is a valid point") }
        return point
    }
}
