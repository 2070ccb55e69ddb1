internal import CNGTCP2

/// An error from the QUIC engine: a code to match on and a human-readable message.
///
/// Modeled on swift-certificates' `CertificateError`: a struct, not an enum, so
/// new codes can be added without breaking callers. Equality compares codes only.
/// Control-flow outcomes (ngtcp2's `NGTCP2_ERR_WRITE_MORE`,
/// `NGTCP2_ERR_STREAM_DATA_BLOCKED`, a full send buffer) are never errors; they
/// are return values.
public struct QUICEngineError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What kind of failure this is.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }

        /// The configuration cannot be used (bad PEM, empty ALPN list, …).
        public static let invalidConfiguration = Code("invalidConfiguration")
        /// A GnuTLS call failed while setting up TLS.
        public static let tlsSetupFailed = Code("tlsSetupFailed")
        /// An ngtcp2 call failed; ``QUICEngineError/libraryErrorCode`` has the `NGTCP2_ERR_*` value.
        public static let libraryError = Code("libraryError")
        /// The stream does not exist (never opened, or already closed and forgotten).
        public static let unknownStream = Code("unknownStream")
        /// The operation is not allowed in the stream's current state (e.g. write after finish).
        public static let invalidStreamState = Code("invalidStreamState")
        /// The connection is closing, draining or closed.
        public static let connectionClosed = Code("connectionClosed")
        /// The peer did not enable datagrams, or the payload is larger than it accepts.
        public static let datagramRejected = Code("datagramRejected")
        /// The operation is only meaningful for the other role (e.g. a server migrating).
        public static let wrongRole = Code("wrongRole")
        /// A received datagram could not be processed and was dropped.
        public static let invalidPacket = Code("invalidPacket")
        /// A connection ID or path operation could not be performed (e.g. no spare connection ID to migrate).
        public static let pathError = Code("pathError")
        /// The peer broke the QUIC protocol (past a stream limit, a flow-control window or a final
        /// size, a DATAGRAM over the negotiated size, …); the connection closes with the matching
        /// transport error, named in ``QUICEngineError/message``.
        public static let peerViolation = Code("peerViolation")

        public var description: String { name }
    }

    /// What kind of failure this is.
    public var code: Code
    /// A one-line explanation for logs.
    public var message: String
    /// The ngtcp2 `NGTCP2_ERR_*` value behind this error, if any.
    public var libraryErrorCode: Int32?

    /// Creates an error.
    public init(_ code: Code, _ message: String, libraryErrorCode: Int32? = nil) {
        self.code = code
        self.message = message
        self.libraryErrorCode = libraryErrorCode
    }

    static func library(_ function: String, _ rv: Int32) -> QUICEngineError {
        QUICEngineError(.libraryError, "\(function): \(String(cString: ngtcp2_strerror(rv)))", libraryErrorCode: rv)
    }

    /// The error for a received packet that shows the peer breaking the protocol, or nil when
    /// `rv` is not such a failure.
    static func peerViolation(_ rv: Int32) -> QUICEngineError? {
        peerViolationReason(rv).map { QUICEngineError(.peerViolation, $0, libraryErrorCode: rv) }
    }

    /// The transport error's name (RFC 9000 §20.1) and what the peer did, for an
    /// `ngtcp2_conn_read_pkt` failure that is the peer's doing; nil for any other failure.
    static func peerViolationReason(_ rv: Int32) -> String? {
        switch rv {
        case NGTCP2_ERR_STREAM_LIMIT: "STREAM_LIMIT_ERROR: the peer used a stream beyond the MAX_STREAMS limit"
        case NGTCP2_ERR_FLOW_CONTROL: "FLOW_CONTROL_ERROR: the peer sent past its flow-control window"
        case NGTCP2_ERR_FINAL_SIZE: "FINAL_SIZE_ERROR: the peer's stream data contradicts the stream's final size"
        case NGTCP2_ERR_STREAM_STATE: "STREAM_STATE_ERROR: the peer sent a frame its stream's state forbids"
        case NGTCP2_ERR_PROTO:
            "PROTOCOL_VIOLATION: the peer sent a frame QUIC forbids here (such as a DATAGRAM over max_datagram_frame_size)"
        case NGTCP2_ERR_FRAME_ENCODING, NGTCP2_ERR_ACK_FRAME: "FRAME_ENCODING_ERROR: the peer sent a malformed frame"
        case NGTCP2_ERR_CONNECTION_ID_LIMIT: "CONNECTION_ID_LIMIT_ERROR: the peer issued more connection IDs than allowed"
        case NGTCP2_ERR_TRANSPORT_PARAM, NGTCP2_ERR_REQUIRED_TRANSPORT_PARAM, NGTCP2_ERR_MALFORMED_TRANSPORT_PARAM:
            "TRANSPORT_PARAMETER_ERROR: the peer's transport parameters are invalid"
        case NGTCP2_ERR_CRYPTO_BUFFER_EXCEEDED: "CRYPTO_BUFFER_EXCEEDED: the peer sent too much handshake data ahead"
        default: nil
        }
    }

    static func gnutls(_ function: String, _ rv: Int32) -> QUICEngineError {
        QUICEngineError(.tlsSetupFailed, "\(function): \(String(cString: gnutls_strerror(rv)))")
    }

    public static func == (lhs: QUICEngineError, rhs: QUICEngineError) -> Bool { lhs.code == rhs.code }
    public func hash(into hasher: inout Hasher) { hasher.combine(code) }

    public var description: String { "QUIC \(code): \(message)" }
}
