import Crypto
import FoundationEssentials
import Glibc
@_spi(Stacks) import QXferCore
import SwiftASN1
import X509

/// A host's long-lived identity: a P-256 key and a self-signed certificate.
///
/// Peers know a host by the SHA-256 ``fingerprint`` of this certificate, like SSH host keys;
/// no certificate authority is involved. Created on first use by ``loadOrCreate(in:)`` and kept
/// under the configuration folder (`host-key.pem`, `host-cert.pem`, mode 0600).
public struct HostIdentity: Sendable {
    /// The certificate, DER-encoded.
    public let certificateDER: [UInt8]
    /// The certificate, PEM-encoded.
    public let certificatePEM: String
    /// The private key, PEM-encoded (PKCS#8).
    public let privateKeyPEM: String
    /// The SHA-256 fingerprint of ``certificateDER``: what peers pin.
    public let fingerprint: Fingerprint

    static let keyFile = "host-key.pem"
    static let certificateFile = "host-cert.pem"

    /// Loads the identity from `directory`, creating it there on first use.
    ///
    /// A missing pair is created; a half-present, unreadable, corrupt or loosely-permitted pair
    /// is an error, never silently replaced, because replacing it would change the fingerprint
    /// every peer has pinned. Processes that start at once on a new folder (a `recv` and a
    /// `send` from one script) agree on one identity: it is created under the folder's lock.
    public static func loadOrCreate(in directory: ConfigDirectory = .standard) throws -> HostIdentity {
        let keyPath = directory.file(keyFile)
        let certificatePath = directory.file(certificateFile)
        if SecureFile.exists(keyPath) && SecureFile.exists(certificatePath) {
            return try load(keyPath: keyPath, certificatePath: certificatePath)
        }
        // Without the lock, two processes that both found no identity wrote a key and a
        // certificate each, and the folder could keep one's key with the other's certificate;
        // one that looked between another's two writes saw half a pair.
        return try directory.whileLocked {
            switch (SecureFile.exists(keyPath), SecureFile.exists(certificatePath)) {
            case (true, true):
                return try load(keyPath: keyPath, certificatePath: certificatePath)
            case (false, false):
                let identity = try generate(commonName: "qxfer " + (ProcessInfo.processInfo.hostName))
                try SecureFile.writeAtomically(Array(identity.privateKeyPEM.utf8), to: keyPath)
                try SecureFile.writeAtomically(Array(identity.certificatePEM.utf8), to: certificatePath)
                return identity
            case (true, false):
                throw QXferError(.identity, "identity is incomplete: \(certificatePath) is missing (remove \(keyPath) to create a new identity)")
            case (false, true):
                throw QXferError(.identity, "identity is incomplete: \(keyPath) is missing (remove \(certificatePath) to create a new identity)")
            }
        }
    }

    /// A secret for QUIC stateless-reset tokens that survives restarts: HKDF-SHA256 of the
    /// private key, so it reveals nothing about the key and changes only with the identity.
    @_spi(Stacks) public var statelessResetSecret: [UInt8] {
        let key = SymmetricKey(data: Array(privateKeyPEM.utf8))
        let derived = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: key, salt: Array("qxfer stateless reset".utf8), info: [], outputByteCount: 32)
        return derived.withUnsafeBytes { Array($0) }
    }

    /// Whether `directory` already holds an identity (or part of one).
    public static func exists(in directory: ConfigDirectory = .standard) -> Bool {
        SecureFile.exists(directory.file(keyFile)) || SecureFile.exists(directory.file(certificateFile))
    }

    /// Loads an existing identity from explicit files.
    public static func load(keyPath: String, certificatePath: String) throws -> HostIdentity {
        let keyPEM = String(decoding: try SecureFile.readPrivate(keyPath), as: UTF8.self)
        let certificatePEM = String(decoding: try SecureFile.readPrivate(certificatePath), as: UTF8.self)
        let key: P256.Signing.PrivateKey
        do {
            key = try P256.Signing.PrivateKey(pemRepresentation: keyPEM)
        } catch {
            throw QXferError(.identity, "cannot read the identity key \(keyPath): not a P-256 private key in PEM")
        }
        let certificate: Certificate
        do {
            certificate = try Certificate(pemEncoded: certificatePEM)
        } catch {
            throw QXferError(.identity, "cannot read the identity certificate \(certificatePath): not a certificate in PEM")
        }
        guard certificate.publicKey == Certificate.PublicKey(key.publicKey) else {
            throw QXferError(.identity, "the identity key \(keyPath) does not belong to the certificate \(certificatePath)")
        }
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return HostIdentity(certificateDER: serializer.serializedBytes, certificatePEM: certificatePEM, privateKeyPEM: keyPEM)
    }

    /// A fresh identity that lives only in memory: for tests, demos and one-off peers.
    public static func ephemeral(commonName: String = "qxfer ephemeral") throws -> HostIdentity {
        try generate(commonName: commonName)
    }

    private init(certificateDER: [UInt8], certificatePEM: String, privateKeyPEM: String) {
        self.certificateDER = certificateDER
        self.certificatePEM = certificatePEM
        self.privateKeyPEM = privateKeyPEM
        self.fingerprint = Fingerprint(certificateDER: certificateDER)
    }

    private static func generate(commonName: String) throws -> HostIdentity {
        let key = P256.Signing.PrivateKey()
        let name = try DistinguishedName { CommonName(commonName) }
        let now = Date()
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: .init(key.publicKey),
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: now.addingTimeInterval(20 * 365 * 24 * 3600),
            issuer: name,
            subject: name,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth, .clientAuth])
            },
            issuerPrivateKey: .init(key)
        )
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        let der = serializer.serializedBytes
        let pem = try certificate.serializeAsPEM().pemString + "\n"
        return HostIdentity(certificateDER: der, certificatePEM: pem, privateKeyPEM: key.pemRepresentation + "\n")
    }
}
