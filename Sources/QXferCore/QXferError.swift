/// An error from qxfer: a stable ``Code`` to match on and a one-line message for people.
///
/// Equality compares codes only, so `catch let error as QXferError where error.code == .peerRefused`
/// works whatever the message says. New codes can be added without breaking callers, which an
/// enum would not allow.
public struct QXferError: Error, Hashable, CustomStringConvertible, Sendable {
    /// What went wrong, as a value to match on.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short machine-readable name, such as `untrusted-peer`.
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The peer could not be reached (refused, unreachable, timed out).
        public static let connectFailed = Code("connect-failed")
        /// The TLS or QUIC handshake failed for a reason other than trust.
        public static let handshakeFailed = Code("handshake-failed")
        /// The peer's certificate fingerprint does not match the pin or the known-hosts entry.
        public static let fingerprintMismatch = Code("fingerprint-mismatch")
        /// The peer presented no certificate, or one that is not on the allow-list.
        public static let untrustedPeer = Code("untrusted-peer")
        /// The peer does not speak the application protocol (ALPN) we require.
        public static let protocolMismatch = Code("protocol-mismatch")
        /// The peer closed the connection before the expected data arrived.
        public static let truncated = Code("truncated")
        /// The peer finished sending; there is nothing more to receive.
        public static let endOfStream = Code("end-of-stream")
        /// A frame or message from the peer is malformed or exceeds a limit.
        public static let malformedMessage = Code("malformed-message")
        /// A frame header from the peer announces a body longer than the framer's limit. The
        /// connection stays open (the peer's protocol may have a way to say why it ends), but
        /// its byte stream is out of step: the caller ends it.
        public static let messageTooLarge = Code("message-too-large")
        /// The connection was closed by an error on the path or by the peer.
        public static let connectionClosed = Code("connection-closed")
        /// Nothing was sent or received for longer than the idle timeout.
        public static let idleTimeout = Code("idle-timeout")
        /// The connection was cancelled by its owner.
        public static let cancelled = Code("cancelled")
        /// The transport cannot do this (QUIC's streams and datagrams on TCP+TLS).
        public static let unsupported = Code("unsupported")
        /// The call is not valid in the connection's current state.
        public static let invalidUse = Code("invalid-use")
        /// The host identity or a trust file (known hosts) cannot be used.
        public static let identity = Code("identity")
        /// A listener could not bind its port.
        public static let bindFailed = Code("bind-failed")
    }

    /// What went wrong.
    public let code: Code
    /// One line for a person: what happened and, where it helps, what to do.
    public let message: String
    /// The lower-level error, if any, kept for logs.
    public let underlying: (any Error & Sendable)?

    public init(_ code: Code, _ message: String, underlying: (any Error & Sendable)? = nil) {
        self.code = code
        self.message = message
        self.underlying = underlying
    }

    public var description: String { message }

    public static func == (lhs: QXferError, rhs: QXferError) -> Bool { lhs.code == rhs.code }
    public func hash(into hasher: inout Hasher) { hasher.combine(code) }
}

/// The `underlying` error of a `connectFailed` whose host name has no address (a typo, a host
/// unknown to DNS): something retrying rarely mends, which a command-line tool says at once.
public struct NameDoesNotResolve: Error, Sendable {
    /// The name that was looked up.
    public let host: String

    public init(host: String) {
        self.host = host
    }
}
