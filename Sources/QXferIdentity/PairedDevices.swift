import Crypto
import FoundationEssentials
import Glibc
import SafeOutput
@_spi(Stacks) import QXferCore
import PlainText

/// The machines this host has paired with (`qxfer pair`): their names and certificate
/// fingerprints, trusted without trust on first use.
///
/// `paired-devices.json` in the configuration folder, mode 0600, written atomically. The file
/// carries a seal, an HMAC-SHA256 of its entries under a key derived from this host's private
/// key, so an entry added or changed by anything but qxfer is an error when read, never
/// silent trust.
public struct PairedDevices: Sendable {
    /// One paired machine.
    public struct Device: Sendable, Hashable, Codable {
        /// The name it gave during pairing.
        public var name: String
        /// The SHA-256 fingerprint of its certificate, as its `qxfer id` prints it.
        public var fingerprint: Fingerprint
        /// When the pairing succeeded.
        public var pairedAt: Date
        /// When it last connected or was connected to; nil if never since pairing.
        public var lastSeen: Date?
        /// The host it was reached at or came from during pairing (a name or an address).
        public var address: String?

        public init(name: String, fingerprint: Fingerprint, pairedAt: Date, lastSeen: Date? = nil, address: String? = nil) {
            self.name = name
            self.fingerprint = fingerprint
            self.pairedAt = pairedAt.wholeSeconds
            self.lastSeen = lastSeen?.wholeSeconds
            self.address = address
        }
    }

    /// The file's path.
    public let path: String
    private let sealKey: SymmetricKey

    /// The paired-devices file of `identity`'s configuration folder.
    public init(in directory: ConfigDirectory = .standard, identity: HostIdentity) {
        self.path = directory.file("paired-devices.json")
        let derived = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: Array(identity.privateKeyPEM.utf8)),
            salt: Array("qxfer paired-devices seal".utf8), info: [], outputByteCount: 32)
        self.sealKey = derived
    }

    private struct Stored: Codable {
        var devices: [Device]
        var seal: String
    }

    /// Every paired device, in pairing order. A missing file is an empty list; a damaged,
    /// unsealed or loosely permitted one is an error naming the file and what to do.
    public func devices() throws -> [Device] {
        guard SecureFile.exists(path) else { return [] }
        let bytes = try SecureFile.readPrivate(path)
        let stored: Stored
        do {
            stored = try Self.decoder.decode(Stored.self, from: Data(bytes))
        } catch {
            throw QXferError(.identity, "\(path) is damaged (not a paired-devices file); remove it and pair again")
        }
        guard Self.constantTimeEqual(Array(stored.seal.utf8), Array(try seal(stored.devices).utf8)) else {
            throw QXferError(
                .identity,
                "\(path) was changed outside qxfer (its seal does not match this host's key); "
                    + "nothing in it is trusted: remove it and pair again")
        }
        return stored.devices
    }

    /// The device with this fingerprint, if paired.
    public func device(withFingerprint fingerprint: Fingerprint) throws -> Device? {
        try devices().first { $0.fingerprint == fingerprint }
    }

    /// Adds a device, replacing any earlier pairing with the same fingerprint or name.
    public func add(_ device: Device) throws {
        try update { devices in
            devices.removeAll { $0.fingerprint == device.fingerprint || $0.name == device.name }
            devices.append(device)
        }
    }

    /// Removes the devices whose name or fingerprint is `nameOrFingerprint`; returns them.
    @discardableResult
    public func remove(_ nameOrFingerprint: String) throws -> [Device] {
        let fingerprint = Fingerprint(parsing: nameOrFingerprint)
        var removed: [Device] = []
        try update { devices in
            removed = devices.filter { $0.name == nameOrFingerprint || $0.fingerprint == fingerprint }
            devices.removeAll { removed.contains($0) }
        }
        return removed
    }

    /// Records that the device with `fingerprint` was just seen; does nothing for others.
    public func markSeen(_ fingerprint: Fingerprint, at date: Date = Date()) throws {
        guard try device(withFingerprint: fingerprint) != nil else { return }
        try update { devices in
            for index in devices.indices where devices[index].fingerprint == fingerprint {
                devices[index].lastSeen = date.wholeSeconds
            }
        }
    }

    /// Read, change, seal and write under an exclusive lock, so two qxfer processes updating
    /// the list at once (a pairing and a transfer's "last seen") never lose each other's change.
    private func update(_ change: (inout [Device]) throws -> Void) throws {
        try ConfigDirectory(path: OutputFile.folder(of: path)).whileLocked {
            var devices = try self.devices()
            try change(&devices)
            let encoded = try Self.encoder.encode(Stored(devices: devices, seal: try seal(devices)))
            try SecureFile.writeAtomically(Array(encoded) + [0x0a], to: path)
        }
    }

    private func seal(_ devices: [Device]) throws -> String {
        let canonical = try Self.canonicalEncoder.encode(devices)
        return TextFormat.hex(HMAC<SHA256>.authenticationCode(for: canonical, using: sealKey))
    }

    private static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return zip(a, b).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
    }

    private static var encoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }

    private static var canonicalEncoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }

    private static var decoder: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

extension Date {
    /// ISO 8601 in the file keeps whole seconds; the seal must see what a reread sees.
    fileprivate var wholeSeconds: Date { Date(timeIntervalSince1970: timeIntervalSince1970.rounded(.down)) }
}
