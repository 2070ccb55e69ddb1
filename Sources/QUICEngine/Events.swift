/// A QUIC stream ID (RFC 9000 §2.1). The low two bits give initiator and direction.
public struct QUICStreamID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The 62-bit stream ID as ngtcp2 passes it (`int64_t stream_id`).
    public let rawValue: Int64
    /// Wraps a raw stream ID.
    public init(rawValue: Int64) { self.rawValue = rawValue }
    /// Whether data flows both ways on this stream.
    public var isBidirectional: Bool { rawValue & 0x2 == 0 }
    /// Whether the client opened this stream.
    public var isClientInitiated: Bool { rawValue & 0x1 == 0 }
    public static func < (lhs: QUICStreamID, rhs: QUICStreamID) -> Bool { lhs.rawValue < rhs.rawValue }
    public var description: String { "stream \(rawValue)" }
}

/// Why a connection ended, modeled on quinn's `ConnectionError`.
public struct QUICCloseReason: Hashable, Sendable, CustomStringConvertible {
    /// The category of the close.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        /// A CONNECTION_CLOSE with a QUIC transport error code (0x1c frame); TLS alerts are 0x100 + alert.
        public static let transport = Kind("transport")
        /// A CONNECTION_CLOSE with an application error code (0x1d frame).
        public static let application = Kind("application")
        /// No packet arrived within the idle timeout; nothing was sent.
        public static let idleTimeout = Kind("idleTimeout")
        /// The handshake did not complete within ``QUICConfiguration/handshakeTimeout``.
        public static let handshakeTimeout = Kind("handshakeTimeout")
        /// The peer sent a stateless reset: it has lost the connection's state.
        public static let statelessReset = Kind("statelessReset")
        /// The server answered with a Version Negotiation packet listing no version we support.
        public static let versionNegotiation = Kind("versionNegotiation")
        public var description: String { name }
    }

    /// The category of the close.
    public var kind: Kind
    /// The error code: transport or application per ``kind``; 0 where none applies.
    public var code: UInt64
    /// The reason phrase carried in CONNECTION_CLOSE (may be empty), or a local explanation.
    public var reason: String
    /// Whether the peer closed (true) or this endpoint did (false).
    public var initiatedByPeer: Bool

    /// Creates a close reason.
    public init(kind: Kind, code: UInt64, reason: String, initiatedByPeer: Bool) {
        self.kind = kind
        self.code = code
        self.reason = reason
        self.initiatedByPeer = initiatedByPeer
    }

    /// QUIC transport error NO_ERROR (0x0).
    public static let noErrorCode: UInt64 = 0x0
    /// First code of the CRYPTO_ERROR range: `0x100 + TLS alert`.
    public static let cryptoErrorBase: UInt64 = 0x100

    /// Whether this is a TLS failure (transport CRYPTO_ERROR range 0x100–0x1ff).
    public var isCryptoError: Bool { kind == .transport && (0x100...0x1ff).contains(code) }

    public var description: String {
        let who = initiatedByPeer ? "peer" : "local"
        return "\(who) \(kind) 0x\(String(code, radix: 16))" + (reason.isEmpty ? "" : " \"\(reason)\"")
    }
}

/// Something that happened inside the engine, polled with ``QUICConnection/pollEvent()``.
///
/// Events are recorded by ngtcp2 callbacks and delivered in the order they occurred.
public enum QUICEvent: Sendable, Equatable {
    /// The TLS handshake finished; `alpn` is the negotiated application protocol.
    /// The peer's certificate is available from ``QUICConnection/peerCertificate``.
    case handshakeCompleted(alpn: String)
    /// The peer opened a stream (`stream_open` callback).
    case streamOpened(QUICStreamID)
    /// New bytes are buffered for the stream; read them with ``QUICConnection/read(stream:maxLength:)``.
    /// Sent once per transition from empty to non-empty.
    case streamReadable(QUICStreamID)
    /// The peer's FIN arrived: after the buffered bytes, the stream has no more data.
    case streamFinished(QUICStreamID)
    /// The peer abandoned its sending side with RESET_STREAM (`stream_reset` callback); buffered data was discarded.
    case streamReset(QUICStreamID, errorCode: UInt64)
    /// The peer asked us to stop sending with STOP_SENDING; ngtcp2 has answered with
    /// RESET_STREAM and further writes fail. ngtcp2 0.12 has no callback for the frame, so
    /// this is noticed when the engine next tries to send on the stream, and `errorCode`
    /// is nil; the peer's code arrives with ``streamClosed(_:errorCode:)``.
    case streamStopSending(QUICStreamID, errorCode: UInt64?)
    /// The send buffer of a stream that refused bytes has room again.
    case streamWritable(QUICStreamID)
    /// Both directions of the stream are done; the engine has forgotten it (`stream_close` callback).
    case streamClosed(QUICStreamID, errorCode: UInt64?)
    /// The peer raised the stream limit: ``QUICConnection/openStream(bidirectional:)`` may succeed again.
    case streamsAvailable(bidirectional: Bool)
    /// An unreliable datagram arrived (`recv_datagram` callback).
    case datagramReceived([UInt8])
    /// The connection now sends on a different path (migration or NAT rebinding).
    case pathChanged(QUICPath)
    /// Path validation finished (`path_validation` callback).
    case pathValidated(QUICPath, succeeded: Bool)
    /// Full-size packets stopped getting through (two probe timeouts in a row), so packets are
    /// now held to this many bytes, QUIC's smallest; nil when the limit is lifted again to try
    /// the path's size. See ``QUICConnectionStats/maxUDPPayloadSize``.
    case packetSizeLimited(Int?)
    /// ngtcp2 issued a new source connection ID; a server driver routes it to this connection.
    /// `statelessResetToken` is the token bound to it.
    case connectionIDIssued(QUICConnectionID, statelessResetToken: [UInt8])
    /// A source connection ID was retired; the driver should stop routing it here.
    case connectionIDRetired(QUICConnectionID)
    /// The connection is closed. Once ``QUICConnection/isTerminated`` the driver can drop it.
    case connectionClosed(QUICCloseReason)
}

/// One or more UDP datagrams to send on one path, batched for GSO (`UDP_SEGMENT`).
///
/// `data` holds `segmentCount` packets back to back; every packet is exactly
/// `segmentSize` bytes except the last, which may be shorter. With NIO this maps to
/// `AddressedEnvelope.Metadata(segmentSize:)`; without GSO, send `data` in slices of
/// `segmentSize`.
public struct QUICTransmit: Sendable {
    /// Where the packets go and how they are cut.
    public var info: QUICTransmitInfo
    /// The packets, back to back.
    public var data: [UInt8]

    public init(_ info: QUICTransmitInfo, data: [UInt8]) {
        self.info = info
        self.data = data
    }

    /// Where to send from and to.
    public var path: QUICPath { info.path }
    /// ECN codepoint to set on every segment.
    public var ecn: QUICECN { info.ecn }
    /// The size of each segment but the last.
    public var segmentSize: Int { info.segmentSize }
    /// How many packets `data` holds.
    public var segmentCount: Int { info.segmentCount }

    /// The individual datagrams (for drivers without GSO and for tests).
    public var segments: [ArraySlice<UInt8>] {
        stride(from: 0, to: data.count, by: max(segmentSize, 1)).map {
            data[$0..<min($0 + segmentSize, data.count)]
        }
    }
}

/// A batch of datagrams that ``QUICConnection/pollTransmit(now:into:)`` wrote: where they go
/// and how the bytes are cut into packets.
public struct QUICTransmitInfo: Sendable, Equatable {
    /// Where to send from and to.
    public var path: QUICPath
    /// ECN codepoint to set on every segment.
    public var ecn: QUICECN
    /// Bytes written, all packets together.
    public var byteCount: Int
    /// The size of each segment but the last.
    public var segmentSize: Int
    /// How many packets were written.
    public var segmentCount: Int
}

/// The result of ``QUICConnection/read(stream:maxLength:)``.
public struct QUICStreamRead: Sendable, Equatable {
    /// Bytes in stream order (possibly empty).
    public var bytes: [UInt8]
    /// True when these bytes end the stream: the FIN has arrived and nothing is left.
    public var isFinished: Bool
}

/// Path and congestion statistics, from `ngtcp2_conn_get_conn_stat` plus the engine's own counters.
public struct QUICConnectionStats: Sendable, Equatable {
    /// Smoothed round-trip time.
    public var smoothedRTT: Duration
    /// Round-trip time variation.
    public var rttVariance: Duration
    /// Smallest round-trip time seen.
    public var minRTT: Duration
    /// Most recent round-trip sample.
    public var latestRTT: Duration
    /// Congestion window in bytes.
    public var congestionWindow: UInt64
    /// Slow-start threshold in bytes (`UInt64.max` until the first loss).
    public var slowStartThreshold: UInt64
    /// Bytes sent and not yet acknowledged or declared lost.
    public var bytesInFlight: UInt64
    /// Estimated delivery rate in bytes per second (0 until measured).
    public var deliveryRate: UInt64
    /// Pacing rate in bytes per nanosecond as ngtcp2 computes it.
    public var pacingRate: Double
    /// Largest UDP payload currently sent on the path (1200 while larger packets are found
    /// not to get through, see ``QUICEvent/packetSizeLimited(_:)``).
    public var maxUDPPayloadSize: Int
    /// Probe timeouts since the last acknowledgement (`pto_count`).
    public var ptoCount: Int
    /// UDP datagrams handed to the driver.
    public var packetsSent: UInt64
    /// UDP datagrams received from the driver.
    public var packetsReceived: UInt64
    /// Bytes of UDP payload handed to the driver.
    public var bytesSent: UInt64
    /// Bytes of UDP payload received from the driver.
    public var bytesReceived: UInt64
    /// Stream bytes the application wrote that the peer has not acknowledged yet, summed over
    /// all streams: waiting in the engine's send buffers or in flight.
    public var streamBytesUnacknowledged: UInt64
    /// Packets carrying stream data that were declared lost, summed over all streams
    /// (`ngtcp2_conn_get_stream_loss_count`); their data is retransmitted.
    public var streamPacketsLost: UInt64
    /// DATAGRAM frames declared lost (`lost_datagram` callback).
    public var datagramsLost: UInt64
    /// Outgoing datagrams dropped before sending (queue full or payload too large).
    public var datagramsDroppedOutgoing: UInt64
    /// Incoming datagrams dropped because the event queue held too many.
    public var datagramsDroppedIncoming: UInt64
}
