import FoundationEssentials
import Glibc
import QXfer
import PlainText
import PairingGroup

/// A pairing code: six decimal digits, as a person reads them off one screen and types them
/// on another.
public struct PairingCode: Sendable, Hashable, CustomStringConvertible {
    /// The digits.
    public let digits: String

    /// A fresh code, uniformly random (one in a million for a guess).
    public static func random() -> PairingCode {
        var generator = SystemRandomNumberGenerator()
        let value = UInt32.random(in: 0..<1_000_000, using: &generator)
        return PairingCode(digits: TextFormat.zeroPadded(value, width: 6))
    }

    private init(digits: String) { self.digits = digits }

    /// A code as typed: six digits; spaces and dashes between them are ignored.
    public init?(parsing text: String) {
        let digits = text.filter { $0 != " " && $0 != "-" }
        guard digits.count == 6, digits.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        self.digits = digits
    }

    /// "482 913": easier to read aloud and to compare.
    public var description: String { "\(digits.prefix(3)) \(digits.suffix(3))" }

    /// The password the exchange proves knowledge of.
    public var password: PairingPassword { PairingPassword(Array(digits.utf8), domain: "qxfer pairing code v1") }
}

/// A low-entropy secret both sides know, and the domain label that keeps one kind of code's
/// scalars apart from another's (docs/PROTOCOL.md §7, §9.1).
public struct PairingPassword: Sendable {
    /// SPAKE2's w.
    let scalar: [UInt8]

    public init(_ password: [UInt8], domain: String) {
        scalar = SPAKE2.passwordScalar(password, domain: domain)
    }
}

/// Why a pairing failed; nothing was stored on this side.
public struct PairingError: Error, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// The codes differed (or someone in between changed the exchange).
        case wrongCode
        /// The peer refused or stopped, saying why.
        case refusedByPeer
        /// The peer broke the pairing protocol.
        case protocolViolation
        /// No answer in time.
        case timedOut
        /// The paired-devices file could not be written.
        case storage
        /// This machine lacks what pairing computes with (OpenSSL's libcrypto).
        case unavailable
    }

    public let kind: Kind
    public let message: String
    public var description: String { message }

    init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }
}

/// The messages of qxfer's pairing protocol (docs/PROTOCOL.md, "Pairing"), JSON-coded on the
/// connection's first stream.
public enum PairingMessage: Codable, Sendable {
    /// Initiator → responder: protocol version, its name, its SPAKE2 share pA.
    case hello(version: Int, name: String, share: Data)
    /// Responder → initiator: its name, its share pB and its key confirmation cB.
    case reply(name: String, share: Data, confirmation: Data)
    /// Initiator → responder: the initiator's key confirmation cA.
    case confirm(confirmation: Data)
    /// Responder → initiator: verified and stored.
    case paired
    /// Either side: the pairing stops, with a reason.
    case refused(reason: String)
}

/// Pairing over one connection: SPAKE2 (RFC 9382) on the code, bound to the connection.
///
/// The transcript's identities are both certificate fingerprints, as each side sees them
/// through the TLS handshake (which proves the matching private keys); the key confirmation
/// also covers the names both sides sent and a TLS exporter value of this very connection. A
/// man in the middle terminates TLS with his own keys, so the fingerprints and the exporter
/// each real side sees differ from the other's and relaying fails; he can only take one guess
/// at the code per attempt, and a failed attempt tells him nothing about it.
public enum Pairing {
    /// The current protocol version.
    static let version = 1
    /// The largest pairing message accepted.
    public static let maximumMessageSize = 4096
    /// How long either side waits for the next message of an attempt.
    public static let messageTimeout: Duration = .seconds(30)
    static let exporterLabel = "EXPORTER-qxfer-pairing"

    /// Throws ``PairingError/Kind/unavailable`` unless this machine can pair: SPAKE2's P-256
    /// arithmetic comes from OpenSSL's libcrypto, loaded when first needed (this call loads it).
    public static func checkAvailable() throws(PairingError) {
        guard P256Group.isAvailable else {
            throw PairingError(.unavailable, "this machine cannot pair: OpenSSL's libcrypto (libcrypto.so.3, Debian package libssl3) could not be loaded")
        }
    }

    /// Runs the initiating side (`qxfer pair HOST`) on a connection to the waiting machine.
    /// On success the peer is stored in `store` and returned.
    public static func initiate<Stack: CoderStack>(
        over connection: NetworkConnection<Stack>, code: PairingCode, name: String, address: String?,
        identity: HostIdentity, store: PairedDevices
    ) async throws -> PairedDevices.Device where Stack.Message == PairingMessage {
        try await initiate(over: connection, password: code.password, context: [], name: name, address: address, identity: identity, store: store)
    }

    /// Runs the initiating side with any password, bound also to `context` (a fourth AAD field
    /// when not empty: a transfer code's candidates transcript, §9.6). `store` nil: the peer is
    /// authenticated and returned, not stored.
    public static func initiate<Stack: CoderStack>(
        over connection: NetworkConnection<Stack>, password: PairingPassword, context: [UInt8], name: String, address: String?,
        identity: HostIdentity, store: PairedDevices?
    ) async throws -> PairedDevices.Device where Stack.Message == PairingMessage {
        try checkAvailable()
        try await connection.start()
        guard let responderFingerprint = connection.peer?.fingerprint else {
            throw PairingError(.protocolViolation, "the other machine presented no certificate")
        }
        let binding = try await Binding(connection: connection, initiator: identity.fingerprint, responder: responderFingerprint, context: context)
        var spake = try SPAKE2(role: .a, w: password.scalar, identityA: binding.identityA, identityB: binding.identityB)
        try await connection.send(.hello(version: version, name: name, share: Data(try spake.start())))

        guard case .reply(let peerName, let share, let peerConfirmation) = try await next(from: connection) else {
            throw PairingError(.protocolViolation, "the other machine did not answer with its share")
        }
        let responderName = try validName(peerName)
        let confirmation: [UInt8]
        do {
            confirmation = try spake.finish(
                peerShare: Array(share), additionalData: binding.additionalData(initiatorName: name, responderName: responderName))
            _ = try spake.verify(peerConfirmation: Array(peerConfirmation))
        } catch {
            try? await connection.send(.refused(reason: "the codes differ"))
            throw wrongCode
        }
        try await connection.send(.confirm(confirmation: Data(confirmation)))
        // A refusal here (the other side could not save) arrives as an error from `next`.
        guard case .paired = try await next(from: connection) else {
            throw PairingError(.protocolViolation, "the other machine answered out of turn")
        }
        let device = PairedDevices.Device(name: responderName, fingerprint: responderFingerprint, pairedAt: Date(), address: address)
        do { try store?.add(device) } catch { throw PairingError(.storage, "paired, but cannot save it: \(error)") }
        return device
    }

    /// Runs the waiting side (`qxfer pair`) on an accepted connection whose first message was
    /// `hello`. On success the peer is stored in `store` and returned.
    public static func respond<Stack: CoderStack>(
        to hello: PairingMessage, over connection: NetworkConnection<Stack>, code: PairingCode, name: String,
        identity: HostIdentity, store: PairedDevices
    ) async throws -> PairedDevices.Device where Stack.Message == PairingMessage {
        try await respond(to: hello, over: connection, password: code.password, context: [], name: name, identity: identity, store: store)
    }

    /// Runs the waiting side with any password, bound also to `context` (as ``initiate(over:password:context:name:address:identity:store:)``).
    public static func respond<Stack: CoderStack>(
        to hello: PairingMessage, over connection: NetworkConnection<Stack>, password: PairingPassword, context: [UInt8], name: String,
        identity: HostIdentity, store: PairedDevices?
    ) async throws -> PairedDevices.Device where Stack.Message == PairingMessage {
        try checkAvailable()
        guard case .hello(let peerVersion, let peerName, let share) = hello else {
            throw PairingError(.protocolViolation, "the other machine did not start with a pairing request")
        }
        guard peerVersion == version else {
            try? await connection.send(.refused(reason: "pairing protocol version \(peerVersion) is not supported (this side speaks \(version))"))
            throw PairingError(.protocolViolation, "the other machine speaks pairing protocol version \(peerVersion), not \(version)")
        }
        guard let initiatorFingerprint = connection.peer?.fingerprint else {
            try? await connection.send(.refused(reason: "present a certificate to pair"))
            throw PairingError(.protocolViolation, "the other machine presented no certificate")
        }
        let initiatorName: String
        do { initiatorName = try validName(peerName) } catch {
            try? await connection.send(.refused(reason: "the name is not acceptable"))
            throw error
        }
        let binding = try await Binding(connection: connection, initiator: initiatorFingerprint, responder: identity.fingerprint, context: context)
        var spake = try SPAKE2(role: .b, w: password.scalar, identityA: binding.identityA, identityB: binding.identityB)
        let ownShare = try spake.start()
        let confirmation: [UInt8]
        do {
            confirmation = try spake.finish(
                peerShare: Array(share), additionalData: binding.additionalData(initiatorName: initiatorName, responderName: name))
        } catch {
            try? await connection.send(.refused(reason: "the share is not a valid group element"))
            throw PairingError(.protocolViolation, "the other machine sent an invalid share")
        }
        try await connection.send(.reply(name: name, share: Data(ownShare), confirmation: Data(confirmation)))

        let answer: PairingMessage
        do {
            answer = try await next(from: connection)
        } catch let error as PairingError where error.kind == .refusedByPeer {
            // The initiator stops here only when our confirmation did not verify: another code.
            throw wrongCode
        }
        guard case .confirm(let peerConfirmation) = answer else {
            throw PairingError(.protocolViolation, "the other machine answered out of turn")
        }
        do { _ = try spake.verify(peerConfirmation: Array(peerConfirmation)) } catch {
            try? await connection.send(.refused(reason: "the codes differ"))
            throw wrongCode
        }
        let device = PairedDevices.Device(
            name: initiatorName, fingerprint: initiatorFingerprint, pairedAt: Date(), address: connection.endpoint?.host)
        do {
            try store?.add(device)
        } catch {
            try? await connection.send(.refused(reason: "the other machine cannot save the pairing"))
            throw PairingError(.storage, "cannot save the pairing: \(error)")
        }
        try await connection.send(.paired)
        return device
    }

    /// The first message of an accepted connection, within the message timeout.
    public static func firstMessage<Stack: CoderStack>(of connection: NetworkConnection<Stack>) async throws -> PairingMessage
    where Stack.Message == PairingMessage {
        try await next(from: connection)
    }

    static let wrongCode = PairingError(
        .wrongCode, "pairing failed: the codes do not match (or someone tried to intercept the pairing); nothing was stored")

    /// Whether a device name is acceptable: names end up in listings and messages, so they
    /// are 1 to 64 bytes of UTF-8 without control or format characters (no terminal escapes,
    /// no bidirectional overrides that would make one name look like another).
    public static func isAcceptableName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 64
            && !name.unicodeScalars.contains { [.control, .format].contains($0.properties.generalCategory) }
    }

    static func validName(_ name: String) throws -> String {
        guard isAcceptableName(name) else { throw PairingError(.protocolViolation, "the other machine sent an unusable name") }
        return name
    }

    private static func next<Stack: CoderStack>(from connection: NetworkConnection<Stack>) async throws -> PairingMessage
    where Stack.Message == PairingMessage {
        try await withThrowingTaskGroup(of: PairingMessage?.self) { group in
            group.addTask { try await connection.receive() }
            group.addTask {
                try await Task.sleep(for: messageTimeout)
                return nil
            }
            defer { group.cancelAll() }
            do {
                guard let message = try await group.next()! else {
                    throw PairingError(.timedOut, "the other machine did not answer within \(messageTimeout)")
                }
                if case .refused(let reason) = message {
                    throw PairingError(.refusedByPeer, "the other machine stopped the pairing: \(printable(reason))")
                }
                return message
            } catch let error as PairingError {
                throw error
            } catch {
                throw PairingError(.protocolViolation, "the pairing connection failed: \(error)")
            }
        }
    }

    /// A peer's text as one harmless line: no control characters (terminal escapes), bounded.
    static func printable(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.prefix(200).map {
            $0.properties.generalCategory == .control || $0.properties.generalCategory == .format ? "?" : $0
        }))
    }

    /// What ties an exchange to this connection and these two machines.
    struct Binding {
        let identityA: [UInt8]
        let identityB: [UInt8]
        let exporter: [UInt8]
        let context: [UInt8]

        init<Stack: NetworkProtocolStack>(connection: NetworkConnection<Stack>, initiator: Fingerprint, responder: Fingerprint, context: [UInt8]) async throws {
            self.context = context
            identityA = Array("qxfer-pair initiator ".utf8) + initiator.bytes
            identityB = Array("qxfer-pair responder ".utf8) + responder.bytes
            do {
                exporter = try await connection.exportKeyingMaterial(label: Pairing.exporterLabel, length: 32)
            } catch {
                throw PairingError(.protocolViolation, "this connection offers no TLS exporter to bind the pairing to: \(error)")
            }
        }

        /// The exporter value, both names and the context when there is one, length-prefixed,
        /// as SPAKE2's additional data.
        func additionalData(initiatorName: String, responderName: String) -> [UInt8] {
            var data: [UInt8] = []
            for field in [exporter, Array(initiatorName.utf8), Array(responderName.utf8)] + (context.isEmpty ? [] : [context]) {
                withUnsafeBytes(of: UInt64(field.count).littleEndian) { data += $0 }
                data += field
            }
            return data
        }
    }
}
