#if canImport(PlainText)  // fuzz/run.sh compiles TerminalText's source into its one module
internal import PlainText
#endif

/// An error of the file-transfer layer: a stable ``Code`` (which is also the code carried by
/// the qxfer/1 `Error` and `Failed` messages) and a one-line message for people.
///
/// Like `QXferError`, equality compares codes only, and new codes can be added without
/// breaking callers. Every error raised while decoding or checking data from the network is a
/// `TransferError`; nothing received can make this module trap.
public struct TransferError: Error, Hashable, CustomStringConvertible, Sendable {
    /// What went wrong, as a value to match on; `rawValue` is the 16-bit wire code.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// The code on the wire (docs/PROTOCOL.md, "Error codes").
        public let rawValue: UInt16
        /// A short machine-readable name, such as `unsafe-path`.
        public let name: String

        public init(rawValue: UInt16) {
            self.rawValue = rawValue
            self.name = Code.known.first { $0.rawValue == rawValue }?.name ?? "error-\(rawValue)"
        }
        init(_ rawValue: UInt16, _ name: String) {
            self.rawValue = rawValue
            self.name = name
        }
        public var description: String { name }
        public static func == (lhs: Code, rhs: Code) -> Bool { lhs.rawValue == rhs.rawValue }
        public func hash(into hasher: inout Hasher) { hasher.combine(rawValue) }

        /// A message could not be decoded: truncated, trailing bytes, bad enum value, bad UTF-8.
        public static let malformed = Code(1, "malformed")
        /// A length, count, size or depth exceeds a protocol limit.
        public static let limitExceeded = Code(2, "limit-exceeded")
        /// A path or symlink target would escape the target directory or is not a valid name.
        public static let unsafePath = Code(3, "unsafe-path")
        /// The receiver lacks the free space for what is offered, or the disk filled up.
        public static let noSpace = Code(4, "no-space")
        /// The receiver (or its user) refused the offer.
        public static let refused = Code(5, "refused")
        /// The target exists and differs from what is offered; it was left untouched.
        public static let exists = Code(6, "exists")
        /// The end-to-end digest (or the resume prefix digest) does not match.
        public static let digestMismatch = Code(7, "digest-mismatch")
        /// A local file-system operation failed.
        public static let io = Code(8, "io")
        /// A message arrived that the protocol does not allow at this point.
        public static let protocolViolation = Code(9, "protocol-violation")
        /// The peer asks for something this implementation does not support (algorithm, flag).
        public static let unsupported = Code(10, "unsupported")
        /// The transfer was cancelled by a user or by the application.
        public static let cancelled = Code(11, "cancelled")
        /// A bug or an unexpected condition in the peer.
        public static let `internal` = Code(12, "internal")
        /// Another transfer is receiving the target right now; it was left untouched.
        public static let busy = Code(13, "busy")
        /// The file is larger than the receiving file system (or the receiver's file size
        /// limit) lets one file be; nothing was written.
        public static let tooLarge = Code(14, "too-large")

        static let known: [Code] = [
            .malformed, .limitExceeded, .unsafePath, .noSpace, .refused, .exists,
            .digestMismatch, .io, .protocolViolation, .unsupported, .cancelled, .internal, .busy, .tooLarge,
        ]
    }

    /// What went wrong.
    public let code: Code
    /// One line for a person (never contains a newline).
    public let message: String

    /// The `errno` value behind an error of a system call, when there is one.
    let systemError: Int32?

    public init(_ code: Code, _ message: String) {
        self.init(code, message, systemError: nil)
    }

    init(_ code: Code, _ message: String, systemError: Int32?) {
        self.code = code
        self.systemError = systemError
        // Control characters escaped (``TerminalText``): a message, a peer's included, always
        // prints as one safe line, while a name's emoji or accents stay as written.
        self.message = TerminalText.escaped(message)
    }

    /// Builds an ``Code/io`` error from `errno` for an operation on a path.
    static func posix(_ operation: String, _ path: String, errno err: Int32) -> TransferError {
        var reason = String(cString: strerror(err))
        if err == EMFILE { reason += " (raise this process's limit: ulimit -n)" }
        let code: Code = (err == ENOSPC || err == EFBIG || err == EDQUOT) ? .noSpace : .io
        return TransferError(code, "\(operation) \(path): \(reason)", systemError: err)
    }

    /// Whether the file system refused this one name or file, not the folder as a whole: a name
    /// it cannot hold (`:` on exFAT, too long), a permission. Another file may still succeed,
    /// where a full disk, a read-only file system or a lack of descriptors would stop them all.
    var concernsOneEntry: Bool {
        code == .exists || code == .busy || [EINVAL, ENAMETOOLONG, EILSEQ, ENOENT, EPERM, EACCES].contains(systemError ?? 0)
    }

    public var description: String { message }
    public static func == (lhs: TransferError, rhs: TransferError) -> Bool { lhs.code == rhs.code }
    public func hash(into hasher: inout Hasher) { hasher.combine(code) }

}

/// An error already told to the peer (or told to us by it): not sent again.
struct AlreadyCommunicated: Error {
    var error: TransferError
}

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
