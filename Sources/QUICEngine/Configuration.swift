internal import CNGTCP2

/// Everything a ``QUICConnection`` needs besides addresses and time: identity,
/// peer verification, ALPN, transport parameters and local limits.
///
/// One value can configure many connections (a server uses the same one for each
/// accepted connection). It is a plain value; nothing here touches the network.
public struct QUICConfiguration: Sendable {
    /// Which congestion controller ngtcp2 runs (`ngtcp2_settings.cc_algo`).
    public struct CongestionControl: Hashable, Sendable, CustomStringConvertible {
        let algorithm: UInt32
        let name: String
        /// CUBIC (`NGTCP2_CC_ALGO_CUBIC`), ngtcp2's default.
        public static let cubic = CongestionControl(algorithm: NGTCP2_CC_ALGO_CUBIC.rawValue, name: "cubic")
        /// BBR v1 (`NGTCP2_CC_ALGO_BBR`).
        public static let bbr = CongestionControl(algorithm: NGTCP2_CC_ALGO_BBR.rawValue, name: "bbr")
        /// BBR v2 (`NGTCP2_CC_ALGO_BBR2`).
        public static let bbr2 = CongestionControl(algorithm: NGTCP2_CC_ALGO_BBR2.rawValue, name: "bbr2")
        /// NewReno (`NGTCP2_CC_ALGO_RENO`).
        public static let reno = CongestionControl(algorithm: NGTCP2_CC_ALGO_RENO.rawValue, name: "reno")
        public var description: String { name }
    }

    /// Whether a server asks the client for a certificate (`gnutls_certificate_server_set_request`).
    public struct ClientAuthentication: Hashable, Sendable {
        let request: UInt32
        /// Do not ask (`GNUTLS_CERT_IGNORE`); clients stay anonymous.
        public static let none = ClientAuthentication(request: GNUTLS_CERT_IGNORE.rawValue)
        /// Ask, but accept a client that sends none (`GNUTLS_CERT_REQUEST`).
        public static let optional = ClientAuthentication(request: GNUTLS_CERT_REQUEST.rawValue)
        /// Ask, and fail the handshake without one (`GNUTLS_CERT_REQUIRE`).
        public static let required = ClientAuthentication(request: GNUTLS_CERT_REQUIRE.rawValue)
    }

    /// Decides whether to accept the peer's leaf certificate (DER). Return true to accept.
    ///
    /// It runs synchronously inside ``QUICConnection/handle(datagram:path:ecn:now:)``
    /// while TLS processes the peer's Certificate message, so it must be quick and
    /// must not call back into the connection. The API layer pins SHA-256
    /// fingerprints, applies trust-on-first-use or allow-lists here.
    public typealias PeerVerifier = @Sendable (_ leafCertificateDER: [UInt8]) -> Bool

    /// The local certificate chain, PEM, leaf first.
    public var certificateChainPEM: String
    /// The local private key, PEM (PKCS#8 "PRIVATE KEY", P-256 in qxfer).
    public var privateKeyPEM: String
    /// Accepts or refuses the peer's leaf certificate.
    public var verifyPeer: PeerVerifier
    /// ALPN protocols in preference order; one must match or the handshake fails.
    public var applicationProtocols: [String] = ["qxfer/1"]
    /// Whether a server requests a client certificate. Ignored by clients.
    public var clientAuthentication: ClientAuthentication = .none
    /// The TLS server name a client sends (SNI). Ignored by servers.
    public var serverName: String = "qxfer"

    /// Congestion controller (`ngtcp2_settings.cc_algo`).
    public var congestionControl: CongestionControl = .cubic
    /// Idle timeout advertised in `max_idle_timeout`; the effective value is the smaller of both peers'.
    public var idleTimeout: Duration = .seconds(30)
    /// Give up the handshake after this long (`ngtcp2_settings.handshake_timeout`).
    public var handshakeTimeout: Duration = .seconds(10)
    /// RTT assumed before the first sample (`ngtcp2_settings.initial_rtt`); nil keeps ngtcp2's 333 ms.
    public var initialRTT: Duration? = nil
    /// Send PING frames to keep an idle connection alive (`ngtcp2_conn_set_keep_alive_timeout`); nil disables.
    public var keepAliveInterval: Duration? = nil

    /// Connection receive window first advertised (`initial_max_data`).
    public var initialConnectionWindow: UInt64 = 1 << 20
    /// Ceiling for connection window auto-tuning (`ngtcp2_settings.max_window`).
    public var maxConnectionWindow: UInt64 = 16 << 20
    /// Per-stream receive window first advertised (`initial_max_stream_data_*`).
    ///
    /// With ``maxStreamWindow`` it bounds what the engine buffers for a reader
    /// that does not keep up: the peer cannot send beyond it until
    /// ``QUICConnection/read(stream:maxLength:)`` consumes bytes.
    public var initialStreamWindow: UInt64 = 256 << 10
    /// Ceiling for per-stream window auto-tuning (`ngtcp2_settings.max_stream_window`).
    public var maxStreamWindow: UInt64 = 6 << 20
    /// How many bidirectional streams the peer may open (`initial_max_streams_bidi`), replenished as they close.
    public var maxIncomingBidirectionalStreams: UInt64 = 128
    /// How many unidirectional streams the peer may open (`initial_max_streams_uni`), replenished as they close.
    public var maxIncomingUnidirectionalStreams: UInt64 = 128

    /// Unacknowledged bytes the engine keeps before ``QUICConnection/write(stream:bytes:finish:)``
    /// accepts less than offered: the floor when ``maxStreamSendBuffer`` lets it follow the path.
    /// The connection's streams share it (each may hold 64 KiB whatever the others hold).
    public var streamSendBufferLimit: Int = 1 << 20
    /// When set, the send buffer follows the path between ``streamSendBufferLimit``
    /// and this ceiling: the congestion window plus one measured bandwidth-delay product
    /// (delivery rate × smoothed RTT), so that what is in flight and what waits for the pacer
    /// both fit on a long fat path, while memory stays bounded. nil keeps the fixed limit.
    public var maxStreamSendBuffer: Int? = nil
    /// When set, new stream data waits while the bytes in flight exceed this many measured
    /// bandwidth-delay products (delivery rate × minimum RTT, plus the RTT's variation on a
    /// path whose delay varies: see `QUICConnection`), or 1 MiB when that is more; until the
    /// pipe is found full at least 1.5 of them, as the estimate trails start-up.
    /// ngtcp2 0.12's BBR in start-up sends at 2.89 times its estimate and fills a path's queue
    /// until it overflows; with a send buffer that no longer bounds what is in flight
    /// (``maxStreamSendBuffer``), this does. Retransmissions and control frames are never held
    /// back. nil: only the congestion controller decides.
    public var maxInFlightBandwidthDelayProducts: Double? = nil
    /// ACK-eliciting packets received before an acknowledgement is sent at once
    /// (`ngtcp2_settings.ack_thresh`, 2 by default as RFC 9000 §13.2.2 suggests). Bulk
    /// transfers take more: each acknowledgement costs the receiver a packet and the sender a
    /// read and a rate sample.
    public var acknowledgementThreshold: Int = 2
    /// Largest DATAGRAM frame accepted (`max_datagram_frame_size`); 0 disables RFC 9221 datagrams.
    public var maxDatagramFrameSize: UInt64 = 1200
    /// Outgoing datagrams waiting for congestion window; when full the oldest is dropped.
    public var maxQueuedOutgoingDatagrams: Int = 64
    /// Received datagrams waiting in the event queue; when full new ones are dropped.
    public var maxQueuedIncomingDatagrams: Int = 256
    /// Largest UDP payload sent (`ngtcp2_settings.max_tx_udp_payload_size`); nil keeps ngtcp2's default with PMTUD.
    public var maxUDPPayloadSize: Int? = nil
    /// Largest UDP payload sent to a loopback address (127.0.0.0/8, ::1) when ``maxUDPPayloadSize``
    /// is nil; nil treats loopback peers like any other.
    ///
    /// The path to a loopback address is this host's loopback interface (MTU 65536), with no
    /// router in between to drop big packets. One 65 000-byte packet costs about the per-packet
    /// work (AEAD set-up, ngtcp2's packet assembly, the kernel's) of one 1452-byte packet, for
    /// 45 times the bytes: `bench/loopback.sh` (1 GiB) went from about 450 to 1200 MB/s.
    public var loopbackUDPPayloadSize: Int? = 65_000
    /// Most packets in one batch (one GSO send), within Linux's 64 segments and 64 000 bytes,
    /// ngtcp2's send quantum, and 1 ms at the pacing rate. 1 disables batching.
    public var maxSegmentsPerTransmit: Int = 64
    /// Length of the connection IDs this endpoint issues. A server's driver needs it to parse
    /// short headers (``QUICPacketHeader/decode(datagram:shortHeaderConnectionIDLength:)``).
    /// Every packet the peer sends carries one: 10 bytes leave a listener's 2-byte prefix and
    /// 8 random bytes (64 bits: no collision among a listener's connections, nothing to guess),
    /// 6 bytes of every packet fewer than 16 would.
    public var connectionIDLength: Int = 10
    /// Bytes every connection ID this endpoint issues begins with (at most
    /// `connectionIDLength - 8`, so at least 8 stay random). A listener derives them from its
    /// stateless-reset secret and lets the kernel drop short-header datagrams that do not carry
    /// them before they reach the process (the way QUIC-LB routes on server IDs in connection
    /// IDs). They name the listener, as its address already does; they link no connection
    /// across paths. Empty by default.
    public var connectionIDPrefix: [UInt8] = []
    /// How many connection IDs the peer may keep for migration (`active_connection_id_limit`).
    public var activeConnectionIDLimit: UInt64 = 4
    /// Forbid the peer from migrating (`disable_active_migration`).
    public var disableActiveMigration: Bool = false
    /// Client: a ticket from an earlier connection to the same server, offered for resumption.
    /// When it carries the server's transport parameters, streams opened and written before the
    /// handshake completes travel as 0-RTT early data; if the server refuses the ticket or the
    /// early data, the engine sends the same bytes again as 1-RTT (``QUICConnection/earlyData``).
    /// A resumed server is not asked for its certificate again: the one stored in the ticket is
    /// given to ``verifyPeer`` when the handshake completes, as the peer's.
    public var resumption: QUICSessionTicket? = nil
    /// Client: receives each session ticket the server issues after the handshake, to be stored
    /// for ``resumption`` of a later connection. Called on the engine's caller, outside ngtcp2.
    public var sessionTicketReceiver: (@Sendable (QUICSessionTicket) -> Void)? = nil
    /// Server: issues session tickets and accepts early data from clients that resume with one
    /// (within ``initialConnectionWindow`` bytes, as flow control bounds any data). A resumed
    /// client's certificate, sealed in its ticket, is given to ``verifyPeer`` again when the
    /// handshake completes; the connection fails if it is refused. nil: no tickets, no 0-RTT.
    /// Early data waits unread until the handshake completes, unless the issuer has a
    /// ``QUICSessionTicketIssuer/register``: then the handshake is reported as soon as the
    /// early data was taken and the certificate passed, half a round trip sooner.
    public var sessionTickets: QUICSessionTicketIssuer? = nil
    /// Stream bytes the peer may send before this side's handshake completes (a resuming
    /// client's early data; on a client, anything a server sends before then); more closes
    /// the connection with FLOW_CONTROL_ERROR. Flow control bounds such data too, but bulk
    /// windows are sized for a long fat path (32 MiB), and it is held before the peer's
    /// certificate is checked (again). An honest client sends at most its first congestion
    /// window early (about 12 KB).
    public var maxEarlyStreamData: UInt64 = 1 << 20
    /// What seals, opens and masks each packet once the keys exist (see ``QUICPacketProtection``).
    public var packetProtection: QUICPacketProtection = .gnutls
    /// Static key from which stateless reset tokens are derived
    /// (``QUICStatelessReset/token(secret:connectionID:)``). A server driver keeps it to send
    /// stateless resets for connections it no longer knows. Random per configuration by default.
    public var statelessResetSecret: [UInt8]

    /// Windows, buffers and acknowledgement spacing for bulk transfer (qxfer's bulk mode), sized
    /// for a long fat lossy path (docs/benchmarks.md, "Why QUIC overshot the emulated WAN"): a
    /// lost packet pins what follows it in the peer's receive window and in this send buffer
    /// for two round trips or more, so both hold a few bandwidth-delay products (500 Mbit/s ×
    /// 50 ms is 3.1 MB). The send buffer grows with the measured path, and with what losses pin,
    /// up to 12 MiB; what is in flight stays within 1.25 of them; one acknowledgement per 8
    /// packets instead of 2 spares three quarters of the receiver's packets and of the sender's
    /// reads. Memory stays bounded whatever the path: 12 MiB of send buffer, and 32 MiB of
    /// receive window for the connection, which one stream may use alone (at 1 % loss on that
    /// path, 12 and 10 MiB of send buffer moved 50.6 and 47.9 MB/s; a sender with 16 MiB peaked
    /// at 65 MiB resident, over the brief's 64). A stream's window is the connection's because
    /// ngtcp2 0.12 announces more credit only once half a window was read: behind a hole the
    /// sender may run as little as half a window ahead, and a stream window of 16 MiB (8 MiB
    /// then, 2.7 bandwidth-delay products) stopped it on flow control every few hundred
    /// milliseconds at 1 % loss (docs/benchmarks.md, "Flow control behind a hole"). The windows
    /// start at their ceilings: ngtcp2 grows a window only when its updates come within two
    /// round trips of each other, and behind a lost packet in the first second none come, so
    /// windows starting at 4 and 8 MiB stopped the sender on flow control for a round trip or
    /// more (docs/benchmarks.md, "Writers woken only when the acknowledged prefix moved").
    /// Memory is bounded by the ceilings either way: a reader that stalls later holds as much
    /// as one that stalls at once. Towards a peer on this host's loopback interface
    /// (`overLoopback`) they start at 4 and 8 MiB: a round trip there is a tenth of a
    /// millisecond, so ngtcp2's doubling keeps up with a fast reader, and a reader whose disk
    /// lags holds less (docs/benchmarks.md, "Receive windows on loopback").
    public mutating func applyBulkTransferLimits(overLoopback: Bool = false) {
        initialStreamWindow = overLoopback ? 4 << 20 : 32 << 20
        initialConnectionWindow = overLoopback ? 8 << 20 : 32 << 20
        maxStreamWindow = 32 << 20
        maxConnectionWindow = 32 << 20
        streamSendBufferLimit = 4 << 20
        maxStreamSendBuffer = 12 << 20
        maxInFlightBandwidthDelayProducts = 1.25
        acknowledgementThreshold = 8
    }

    /// Creates a configuration with the given identity and verifier and defaults elsewhere.
    public init(certificateChainPEM: String, privateKeyPEM: String, verifyPeer: @escaping PeerVerifier) {
        self.certificateChainPEM = certificateChainPEM
        self.privateKeyPEM = privateKeyPEM
        self.verifyPeer = verifyPeer
        self.statelessResetSecret = QUICRandom.bytes(32)
    }

    func validate() throws(QUICEngineError) {
        if applicationProtocols.isEmpty || applicationProtocols.contains(where: { $0.isEmpty || $0.utf8.count > 255 }) {
            throw QUICEngineError(.invalidConfiguration, "ALPN list must be non-empty with 1...255-byte names")
        }
        if connectionIDLength < 4 || connectionIDLength > Int(NGTCP2_MAX_CIDLEN) {
            throw QUICEngineError(.invalidConfiguration, "connectionIDLength must be in 4...20")
        }
        if connectionIDPrefix.count > connectionIDLength - 8 {
            throw QUICEngineError(.invalidConfiguration, "connectionIDPrefix must leave at least 8 random bytes")
        }
        if streamSendBufferLimit <= 0 || maxSegmentsPerTransmit <= 0 || acknowledgementThreshold <= 0
            || (maxStreamSendBuffer.map { $0 < streamSendBufferLimit } ?? false) {
            throw QUICEngineError(.invalidConfiguration, "buffer limits and the acknowledgement threshold must be positive, the send buffer's ceiling at least its floor")
        }
        if let products = maxInFlightBandwidthDelayProducts, !(products > 0 && products.isFinite) {
            throw QUICEngineError(.invalidConfiguration, "maxInFlightBandwidthDelayProducts must be a positive number")
        }
        if statelessResetSecret.isEmpty {
            throw QUICEngineError(.invalidConfiguration, "statelessResetSecret must not be empty")
        }
    }
}

/// Cryptographically secure random bytes from GnuTLS (`gnutls_rnd`).
enum QUICRandom {
    static func bytes(_ count: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        fill(&out)
        return out
    }

    /// A connection ID of `configuration`'s length: its prefix, then random bytes.
    static func connectionID(_ configuration: QUICConfiguration) -> [UInt8] {
        configuration.connectionIDPrefix + bytes(configuration.connectionIDLength - configuration.connectionIDPrefix.count)
    }

    static func fill(_ bytes: inout [UInt8]) {
        let rv = bytes.withUnsafeMutableBytes { gnutls_rnd(GNUTLS_RND_RANDOM, $0.baseAddress, $0.count) }
        precondition(rv == 0, "gnutls_rnd failed")
    }

    static func fill(_ pointer: UnsafeMutableRawPointer, _ count: Int) {
        let rv = gnutls_rnd(GNUTLS_RND_RANDOM, pointer, count)
        precondition(rv == 0, "gnutls_rnd failed")
    }
}

/// The library that protects each packet (AEAD and header protection, RFC 9001 §5).
///
/// GnuTLS always runs the handshake and produces the traffic secrets. By default
/// ngtcp2_crypto_gnutls also makes the packet keys and protects every packet with GnuTLS; a
/// stack may hand in another backend that takes over from the secrets on (QXferQUIC hands in
/// BoringSSL's, several times cheaper per packet on CPUs with VAES). Both ends of a connection
/// choose independently: the packets are the same on the wire.
public struct QUICPacketProtection: @unchecked Sendable {  // a pointer to an immutable, static C table
    let backend: UnsafePointer<cngtcp2_packet_protection>?

    /// ngtcp2_crypto_gnutls's own packet protection.
    public static let gnutls = QUICPacketProtection(backend: nil)

    /// A backend given as the address of a static `cngtcp2_packet_protection` (CNGTCP2.h)
    /// that lives as long as the process.
    public init(backend: UnsafeRawPointer) {
        self.backend = backend.assumingMemoryBound(to: cngtcp2_packet_protection.self)
    }

    private init(backend: UnsafePointer<cngtcp2_packet_protection>?) {
        self.backend = backend
    }
}
