/// The messages of qxfer/1, as values. docs/PROTOCOL.md gives their exact encoding;
/// ``MessageCodec`` turns them into bytes and back.

import FoundationEssentials

/// What an offered entry is.
public enum EntryKind: UInt8, Sendable, Hashable, CaseIterable {
    /// A regular file (or, with ``OfferEntry/Flags/sizeUnknown``, a stream such as stdin).
    case file = 0
    /// A directory (possibly empty).
    case directory = 1
    /// A symbolic link, sent as a link: its target is carried, never followed.
    case symlink = 2
}

/// The end-to-end digest used for every file of one offer.
public enum DigestAlgorithm: UInt8, Sendable, Hashable, CaseIterable {
    /// XXH3-128, canonical (big-endian) form: 16 bytes. The default.
    case xxh3_128 = 1
    /// SHA-256: 32 bytes, as `sha256sum` prints.
    case sha256 = 2

    /// The digest length in bytes.
    public var digestLength: Int {
        switch self {
        case .xxh3_128: 16
        case .sha256: 32
        }
    }

    /// The name used on the command line and in reports (`xxh3-128`, `sha256`).
    public var name: String {
        switch self {
        case .xxh3_128: "xxh3-128"
        case .sha256: "sha256"
        }
    }
}

/// One entry of an ``Offer``: a file, a directory or a symlink, named by its path relative to
/// the transfer's root as UTF-8 components. Nothing here is trusted until ``SafePath`` checks it.
public struct OfferEntry: Sendable, Hashable {
    /// Per-entry flags (a bit set on the wire, one byte).
    public struct Flags: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        /// The size is not known in advance (a stream such as stdin): `size` is 0 on the wire,
        /// the entry cannot be resumed and free space is not checked for it.
        public static let sizeUnknown = Flags(rawValue: 1)
        /// The sender sends this file whole right after the offer, without waiting for Accept
        /// (docs/PROTOCOL.md §3.7): a file of known size, at most
        /// ``ProtocolLimits/maximumEarlyFileSize`` bytes, in an offer with ``Offer/Flags/early``.
        public static let early = Flags(rawValue: 2)
        /// All flags this implementation understands; others are rejected as ``TransferError/Code/unsupported``.
        public static let known: Flags = [.sizeUnknown, .early]
    }

    public var kind: EntryKind
    public var flags: Flags
    /// The relative path, one element per component (no `/` inside a component).
    public var path: [String]
    /// The size in bytes (files only; 0 for directories and symlinks).
    public var size: UInt64
    /// The permission bits (`mode & 0o7777`); the receiver applies only `mode & 0o777`.
    public var mode: UInt32
    /// Modification time, nanoseconds since the Unix epoch (may be negative).
    public var modificationTime: Int64
    /// The symlink's target exactly as `readlink` returned it (symlinks only; empty otherwise).
    public var linkTarget: String

    public init(
        kind: EntryKind, flags: Flags = [], path: [String], size: UInt64 = 0, mode: UInt32,
        modificationTime: Int64, linkTarget: String = ""
    ) {
        self.kind = kind
        self.flags = flags
        self.path = path
        self.size = size
        self.mode = mode
        self.modificationTime = modificationTime
        self.linkTarget = linkTarget
    }
}

/// Sender → receiver, first message on the control stream: what the sender wants to send.
public struct Offer: Sendable, Hashable {
    /// Offer flags (one byte on the wire): what the sender may do beyond the base protocol.
    public struct Flags: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        /// The sender may send ``Message/batch(_:)`` messages and several entries, one after
        /// another, on one QUIC data stream; the receiver may answer verdicts in batches
        /// (docs/PROTOCOL.md §3.6). A receiver that does not know it refuses the offer.
        public static let batches = Flags(rawValue: 1)
        /// Entries flagged ``OfferEntry/Flags/early`` follow the offer at once, before Accept
        /// (docs/PROTOCOL.md §3.7). A receiver that does not know it refuses the offer.
        public static let early = Flags(rawValue: 2)
        /// The sender may send ``Message/zeros(_:)`` for runs of zeros (a sparse file's holes,
        /// docs/PROTOCOL.md §3.8). A receiver that does not know it refuses the offer.
        public static let zeros = Flags(rawValue: 4)
        /// The sender takes an Accept sent in parts (docs/PROTOCOL.md §3.9). Set only when the
        /// offer goes in parts or its Accept could: a receiver that does not know it refuses the offer.
        public static let long = Flags(rawValue: 8)
        /// All flags this implementation understands; others are ``TransferError/Code/unsupported``.
        public static let known: Flags = [.batches, .early, .zeros, .long]
    }

    /// The digest the sender computes for every file.
    public var algorithm: DigestAlgorithm
    /// The entries, in an order where every directory comes before what it contains.
    public var entries: [OfferEntry]
    /// What the sender may do beyond the base protocol.
    public var flags: Flags

    public init(algorithm: DigestAlgorithm, entries: [OfferEntry], flags: Flags = []) {
        self.algorithm = algorithm
        self.entries = entries
        self.flags = flags
    }
}

/// The receiver's answer for one entry of an offer.
public struct EntryAnswer: Sendable, Hashable {
    /// What the receiver will do with the entry.
    public enum Disposition: UInt8, Sendable, Hashable, CaseIterable {
        /// Send the entry's data from `offset`. When `offset > 0`, `prefixDigest` is the digest
        /// of the bytes `[0, offset)` the receiver holds; the sender checks it against its own
        /// file and sends from 0 instead if it differs.
        case send = 0
        /// The target already exists with the offered size; `prefixDigest` is its full digest.
        /// The sender sends no data, only FileDone; the receiver answers Verified if the digests
        /// are equal and Failed(`exists`) otherwise. The target is never modified.
        case present = 1
        /// The receiver will not take this entry (`code` says why). Nothing is sent for it.
        case skip = 2
    }

    public var disposition: Disposition
    /// Why the entry is skipped (0 unless `disposition == .skip`).
    public var code: UInt16
    /// Where the data should start (0 unless `disposition == .send` and resuming).
    public var offset: UInt64
    /// The digest of the held prefix (`send`, `offset > 0`) or of the existing file (`present`).
    public var prefixDigest: [UInt8]

    public init(disposition: Disposition, code: UInt16 = 0, offset: UInt64 = 0, prefixDigest: [UInt8] = []) {
        self.disposition = disposition
        self.code = code
        self.offset = offset
        self.prefixDigest = prefixDigest
    }

    /// Send everything from the start.
    public static let sendAll = EntryAnswer(disposition: .send)
}

/// Receiver → sender: the offer is accepted, with one answer per entry, in offer order.
public struct Accept: Sendable, Hashable {
    public var answers: [EntryAnswer]
    public init(answers: [EntryAnswer]) { self.answers = answers }
}

/// A code with a one-line message: the body of Decline and Error.
public struct Refusal: Sendable, Hashable {
    public var code: TransferError.Code
    public var message: String
    public init(code: TransferError.Code, message: String) {
        self.code = code
        self.message = message
    }
    public init(_ error: TransferError) { self.init(code: error.code, message: error.message) }
    /// The refusal as an error to throw.
    public var error: TransferError { TransferError(code, message) }
}

/// Sender → receiver: bytes of one file at an offset.
public struct FileData: Sendable, Hashable {
    /// The index of the entry in the offer.
    public var entry: UInt32
    /// Where `bytes` go in the file.
    public var offset: UInt64
    /// 1 ... ``ProtocolLimits/maximumChunkSize`` bytes. `Data`, so that a received chunk can
    /// be a view of the frame the connection handed over instead of a copy of it.
    public var bytes: Data
    public init(entry: UInt32, offset: UInt64, bytes: Data) {
        self.entry = entry
        self.offset = offset
        self.bytes = bytes
    }
    public init(entry: UInt32, offset: UInt64, bytes: [UInt8]) {
        self.init(entry: entry, offset: offset, bytes: Data(bytes))
    }
}

/// Sender → receiver: `length` bytes of value 0 of one file at an offset, in place of a
/// FileData carrying them (docs/PROTOCOL.md §3.8); only when the offer set ``Offer/Flags/zeros``.
public struct Zeros: Sendable, Hashable {
    /// The index of the entry in the offer.
    public var entry: UInt32
    /// Where the zeros go in the file.
    public var offset: UInt64
    /// 1 ... ``ProtocolLimits/maximumZerosLength``.
    public var length: UInt64
    public init(entry: UInt32, offset: UInt64, length: UInt64) {
        self.entry = entry
        self.offset = offset
        self.length = length
    }
}

/// Sender → receiver: all of a file has been sent; its size and whole-file digest.
public struct FileDone: Sendable, Hashable {
    public var entry: UInt32
    public var size: UInt64
    public var algorithm: DigestAlgorithm
    public var digest: [UInt8]
    public init(entry: UInt32, size: UInt64, algorithm: DigestAlgorithm, digest: [UInt8]) {
        self.entry = entry
        self.size = size
        self.algorithm = algorithm
        self.digest = digest
    }
}

/// Receiver → sender: one entry could not be completed.
public struct EntryFailure: Sendable, Hashable {
    public var entry: UInt32
    public var code: TransferError.Code
    public var message: String
    public init(entry: UInt32, code: TransferError.Code, message: String) {
        self.entry = entry
        self.code = code
        self.message = message
    }
}

/// Receiver → sender, last message: every entry has been answered.
public struct Complete: Sendable, Hashable {
    /// Entries written (or found present) and verified, including directories and symlinks.
    public var succeeded: UInt32
    /// Entries skipped or failed.
    public var failed: UInt32
    public init(succeeded: UInt32, failed: UInt32) {
        self.succeeded = succeeded
        self.failed = failed
    }
}

/// Any qxfer/1 message.
public enum Message: Sendable, Hashable {
    case offer(Offer)
    case accept(Accept)
    case decline(Refusal)
    case fileData(FileData)
    case zeros(Zeros)
    case fileDone(FileDone)
    case verified(entry: UInt32)
    case failed(EntryFailure)
    case complete(Complete)
    case error(Refusal)
    /// Several FileData/Zeros/FileDone (sender) or Verified/Failed (receiver) in one frame, handled
    /// in order as if each had come alone; only when the offer set ``Offer/Flags/batches``.
    indirect case batch([Message])

    /// The message's type on the wire.
    public var type: MessageType {
        switch self {
        case .offer: .offer
        case .accept: .accept
        case .decline: .decline
        case .fileData: .fileData
        case .zeros: .zeros
        case .fileDone: .fileDone
        case .verified: .verified
        case .failed: .failed
        case .complete: .complete
        case .error: .error
        case .batch: .batch
        }
    }
}

/// The type field of a frame (UInt32 big-endian on the wire, as the `TLV` framer carries it).
public enum MessageType: UInt32, Sendable, Hashable, CaseIterable {
    case offer = 1
    case accept = 2
    case decline = 3
    case fileData = 4
    case fileDone = 5
    case verified = 6
    case failed = 7
    case complete = 8
    case error = 9
    case batch = 10
    case zeros = 11
}
