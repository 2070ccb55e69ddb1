internal import CNGTCP2

/// A sans-IO QUIC connection: one `ngtcp2_conn` with TLS 1.3 from GnuTLS.
///
/// Shaped like quinn-proto's `Connection`. The driver feeds it inputs —
/// ``handle(datagram:path:ecn:now:)``, ``handleTimeout(now:)`` and application
/// commands (streams, datagrams, ``close(errorCode:reason:now:)``) — and then polls
/// outputs in this order until each returns nil:
///
/// 1. ``pollTransmit(now:)`` — datagrams to send (batched for GSO);
/// 2. ``pollEvent()`` — what happened (handshake, stream data, close, …);
/// 3. ``nextTimeout`` — when to call ``handleTimeout(now:)`` next. It includes
///    ngtcp2's pacing timer, so after ``pollTransmit(now:)`` returns nil the driver
///    must wait for it even when data is queued.
///
/// The engine never reads a clock or touches a socket; `now` is always an input.
/// ngtcp2 callbacks only record into the engine's queues; follow-up work they
/// imply (window credit, stream-limit credit) runs after ngtcp2 returns.
///
/// Not thread-safe and deliberately not `Sendable`: one connection belongs to one
/// event loop (or one test) at a time.
public final class QUICConnection {
    /// Whether this endpoint is the server.
    public let isServer: Bool
    let configuration: QUICConfiguration

    // C state. `conn` is the ngtcp2_conn*; `connRef` is the ngtcp2_crypto_conn_ref the
    // GnuTLS session points at. Both are freed in deinit; callbacks can only run inside
    // ngtcp2 calls made by this object, so the unretained self pointer they carry is valid.
    private(set) var conn: OpaquePointer?
    private let connRef: UnsafeMutablePointer<ngtcp2_crypto_conn_ref>
    var tls: TLSSession?

    private enum State {
        case open
        /// We sent CONNECTION_CLOSE; answer further packets with it until the deadline.
        case closing(deadline: QUICTime)
        /// The peer closed; stay silent until the deadline.
        case draining(deadline: QUICTime)
        case terminated
    }
    private var state: State = .open
    var pendingClose: (kind: UInt32, code: UInt64, reason: [UInt8])?
    private var closePacket: QUICTransmit?
    private var packetsInClosing = 0
    private var closeReported = false

    private var events: [QUICEvent] = []
    private var eventHead = 0
    private var queuedIncomingDatagrams = 0

    var streams: [Int64: StreamState] = [:]
    private var sendQueue: [Int64] = []
    private var sendQueueMembers: Set<Int64> = []
    private var roundRobin = 0

    private var outgoingDatagrams: [[UInt8]] = []
    private var outgoingDatagramHead = 0
    private var nextDatagramID: UInt64 = 0

    private var carriedTransmit: QUICTransmit?
    /// Scratch space for the stream bytes offered to one packet, allocated once, not per packet.
    private let streamVectors = UnsafeMutableBufferPointer<ngtcp2_vec>.allocate(capacity: 16)
    /// Memory of every stream's send buffer.
    private let sendBlocks = SendBlockPool()
    /// Streams whose writer was cut short and waits for ``QUICEvent/streamWritable(_:)``.
    private var writersWaiting: Set<Int64> = []
    private var lastExpiryHandled: QUICTime?
    /// When the bytes this connection put in flight so far have left at the pacing rate: the
    /// base for the next batch's pacing interval (see ``pollTransmit(now:into:)``).
    private var pacedUntil = QUICTime(nanoseconds: 0)
    /// The rate the last batch was paced at, in bytes per nanosecond; 0 before the first.
    private var pacingRate: Double = 0
    /// The highest delivery rate measured on this connection, in bytes per second.
    private var highestDeliveryRate: UInt64 = 0
    /// Whether the delivery-rate estimate has stopped growing (see ``pacingRateUnderInFlightCap(_:now:)``).
    private var pipeFilled = false
    /// Whether more than 2 % of the packets sent since the path last showed a queue were lost
    /// (see ``noteHeavyLoss(_:)``); it lowers the in-flight cap's floor.
    private var heavyLossSeen = false
    /// Packets sent and lost when ``noteHeavyLoss(_:)`` last saw a queue.
    private var lossCountedSince: (sent: UInt64, lost: UInt64) = (0, 0)
    /// The estimate growth is measured against, the rounds it has not grown 25 % over it, and
    /// when the current round (one smoothed RTT) ends.
    private var fullRateEstimate: UInt64 = 0
    private var roundsWithoutGrowth = 0
    private var roundEnds = QUICTime(nanoseconds: 0)
    /// How far the smoothed RTT stayed above the minimum while too little was in flight to queue
    /// anywhere (see ``inFlightCap(_:)``), in nanoseconds.
    private var unqueuedRTTExcess: UInt64 = 0
    private var currentPath: QUICPath
    /// Packets held to QUIC's smallest size while larger ones do not get through.
    private var packetSizeFallback = PacketSizeFallback()

    // Recorded by callbacks, acted on after the ngtcp2 call returns.
    private var handshakeCompletedFlag = false
    /// Stream bytes received before the handshake completed (a client's 0-RTT data).
    private var earlyStreamBytes: UInt64 = 0
    private var handshakeReported = false
    private var statelessResetReceived = false
    private var pendingConnectionCredit: UInt64 = 0
    private var pendingRemoteBidiCredit = 0
    private var pendingRemoteUniCredit = 0

    var verifiedPeerCertificate: [UInt8]?
    /// The peer's leaf certificate (DER) once TLS has received it; nil if the peer sent none.
    public private(set) var peerCertificate: [UInt8]?
    /// The negotiated ALPN protocol once the handshake completed.
    public private(set) var negotiatedALPN: String?

    private var counters = (packetsSent: UInt64(0), packetsReceived: UInt64(0), bytesSent: UInt64(0),
                            bytesReceived: UInt64(0), datagramsLost: UInt64(0), datagramsDroppedOut: UInt64(0),
                            datagramsDroppedIn: UInt64(0), closedStreamLoss: UInt64(0))

    /// The connection ID the client first sent to (a server driver routes it here until the handshake completes).
    public let originalDestinationConnectionID: QUICConnectionID

    // MARK: - Creation

    /// Creates a client connection and prepares its first Initial packet.
    ///
    /// - Parameters:
    ///   - configuration: identity, verifier, ALPN and limits.
    ///   - path: local and server addresses.
    ///   - now: the current time.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_client_new`.
    public init(clientWith configuration: QUICConfiguration, path: QUICPath, now: QUICTime) throws(QUICEngineError) {
        try configuration.validate()
        self.isServer = false
        self.configuration = configuration
        self.currentPath = path
        self.connRef = .allocate(capacity: 1)
        var dcidBytes = [UInt8](repeating: 0, count: 18)
        QUICRandom.fill(&dcidBytes)
        self.originalDestinationConnectionID = QUICConnectionID(dcidBytes)!
        connRef.initialize(to: ngtcp2_crypto_conn_ref(get_conn: getConnThunk, user_data: nil))
        connRef.pointee.user_data = Unmanaged.passUnretained(self).toOpaque()

        tls = try TLSSession(isServer: false, configuration: configuration, connRef: connRef)
        let scid = QUICConnectionID(QUICRandom.connectionID(configuration))!
        var dcid = originalDestinationConnectionID.ngtcp2CID
        var scidC = scid.ngtcp2CID
        var callbacks = Self.makeCallbacks(isServer: false, packetProtection: configuration.packetProtection)
        var settings = makeSettings(now: now, remote: path.remote)
        var params = makeTransportParameters()
        var newConn: OpaquePointer?
        let rv = path.withNGTCP2Path { p in
            cngtcp2_conn_client_new(&newConn, &dcid, &scidC, p, NGTCP2_PROTO_VER_V1, &callbacks, &settings, &params,
                                    nil, Unmanaged.passUnretained(self).toOpaque())
        }
        guard rv == 0, let newConn else { throw .library("ngtcp2_conn_client_new", rv) }
        conn = newConn
        ngtcp2_conn_set_tls_native_handle(newConn, UnsafeMutableRawPointer(tls!.session))
        if let keepAlive = configuration.keepAliveInterval {
            ngtcp2_conn_set_keep_alive_timeout(newConn, keepAlive.quicNanoseconds)
        }
        prepareEarlyData(newConn)
        recordEvent(.connectionIDIssued(scid, statelessResetToken: []))
    }

    /// Creates a server connection for a client's first Initial packet.
    ///
    /// Pass the same datagram to ``handle(datagram:path:ecn:now:)`` afterwards.
    /// - Parameters:
    ///   - configuration: identity, verifier, ALPN and limits.
    ///   - initialPacket: the header accepted by ``QUICInitialPacket/accept(datagram:)``.
    ///   - path: the server's local address and the client's address.
    ///   - now: the current time.
    ///   - retriedFrom: the client's original destination connection ID when `initialPacket`
    ///     carries a Retry token validated by ``QUICRetry/validate(_:remote:secret:now:)``; the
    ///     transport parameters then tell the client about the Retry, as it checks.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_server_new`.
    public init(serverWith configuration: QUICConfiguration, initialPacket: QUICInitialPacket, path: QUICPath,
                now: QUICTime, retriedFrom originalDestination: QUICConnectionID? = nil) throws(QUICEngineError) {
        try configuration.validate()
        self.isServer = true
        self.configuration = configuration
        self.currentPath = path
        self.connRef = .allocate(capacity: 1)
        self.originalDestinationConnectionID = originalDestination ?? initialPacket.destinationConnectionID
        connRef.initialize(to: ngtcp2_crypto_conn_ref(get_conn: getConnThunk, user_data: nil))
        connRef.pointee.user_data = Unmanaged.passUnretained(self).toOpaque()

        tls = try TLSSession(isServer: true, configuration: configuration, connRef: connRef)
        let scid = QUICConnectionID(QUICRandom.connectionID(configuration))!
        var dcid = initialPacket.sourceConnectionID.ngtcp2CID
        var scidC = scid.ngtcp2CID
        var callbacks = Self.makeCallbacks(isServer: true, packetProtection: configuration.packetProtection)
        var settings = makeSettings(now: now, remote: path.remote)
        var params = makeTransportParameters()
        if let originalDestination {
            params.original_dcid = originalDestination.ngtcp2CID
            params.retry_scid = initialPacket.destinationConnectionID.ngtcp2CID
            params.retry_scid_present = 1
        } else {
            params.original_dcid = initialPacket.destinationConnectionID.ngtcp2CID
        }
        let token = QUICStatelessReset.token(secret: configuration.statelessResetSecret, connectionID: scid)
        withUnsafeMutableBytes(of: &params.stateless_reset_token) { $0.copyBytes(from: token) }
        params.stateless_reset_token_present = 1
        var newConn: OpaquePointer?
        let rv = path.withNGTCP2Path { p in
            cngtcp2_conn_server_new(&newConn, &dcid, &scidC, p, initialPacket.version, &callbacks, &settings, &params,
                                    nil, Unmanaged.passUnretained(self).toOpaque())
        }
        guard rv == 0, let newConn else { throw .library("ngtcp2_conn_server_new", rv) }
        conn = newConn
        ngtcp2_conn_set_tls_native_handle(newConn, UnsafeMutableRawPointer(tls!.session))
        if let keepAlive = configuration.keepAliveInterval {
            ngtcp2_conn_set_keep_alive_timeout(newConn, keepAlive.quicNanoseconds)
        }
        recordEvent(.connectionIDIssued(scid, statelessResetToken: token))
    }

    deinit {
        if let conn { ngtcp2_conn_del(conn) }
        connRef.deinitialize(count: 1)
        connRef.deallocate()
        streamVectors.deallocate()
        // `tls` (session, credentials) is released after this body.
    }

    private func makeSettings(now: QUICTime, remote: QUICSocketAddress) -> ngtcp2_settings {
        var settings = ngtcp2_settings()
        cngtcp2_settings_default(&settings)
        settings.initial_ts = now.nanoseconds
        settings.cc_algo = ngtcp2_cc_algo(configuration.congestionControl.algorithm)
        settings.max_window = configuration.maxConnectionWindow
        settings.max_stream_window = configuration.maxStreamWindow
        settings.handshake_timeout = configuration.handshakeTimeout.quicNanoseconds
        settings.ack_thresh = configuration.acknowledgementThreshold
        if let rtt = configuration.initialRTT { settings.initial_rtt = rtt.quicNanoseconds }
        if let size = configuration.maxUDPPayloadSize ?? (remote.isLoopback ? configuration.loopbackUDPPayloadSize : nil) {
            settings.max_tx_udp_payload_size = size
            settings.no_tx_udp_payload_size_shaping = 1
        }
        return settings
    }

    private func makeTransportParameters() -> ngtcp2_transport_params {
        var params = ngtcp2_transport_params()
        cngtcp2_transport_params_default(&params)
        let c = configuration
        params.initial_max_data = c.initialConnectionWindow
        params.initial_max_stream_data_bidi_local = c.initialStreamWindow
        params.initial_max_stream_data_bidi_remote = c.initialStreamWindow
        params.initial_max_stream_data_uni = c.initialStreamWindow
        params.initial_max_streams_bidi = c.maxIncomingBidirectionalStreams
        params.initial_max_streams_uni = c.maxIncomingUnidirectionalStreams
        params.max_idle_timeout = c.idleTimeout.quicNanoseconds
        params.max_datagram_frame_size = c.maxDatagramFrameSize
        params.active_connection_id_limit = c.activeConnectionIDLimit
        params.disable_active_migration = c.disableActiveMigration ? 1 : 0
        return params
    }

    // MARK: - Inputs

    /// Processes one received UDP datagram.
    ///
    /// Undecryptable, malformed or stray datagrams are dropped silently, as QUIC
    /// requires. An error is thrown only when the datagram made the connection fail;
    /// a ``QUICEvent/connectionClosed(_:)`` event is queued in that case too.
    /// - Parameters:
    ///   - datagram: the UDP payload.
    ///   - path: the local address it arrived on and the address it came from.
    ///   - ecn: the ECN bits of the IP header.
    ///   - now: the current time.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_read_pkt`.
    public func handle(datagram: UnsafeRawBufferPointer, path: QUICPath, ecn: QUICECN = .notECT,
                       now: QUICTime) throws(QUICEngineError) {
        guard let conn else { return }
        counters.packetsReceived += 1
        counters.bytesReceived += UInt64(datagram.count)
        switch state {
        case .open:
            break
        case .closing:
            // Answer with our CONNECTION_CLOSE, backing off exponentially (RFC 9000 §10.2.1).
            packetsInClosing += 1
            if packetsInClosing & (packetsInClosing - 1) == 0, let packet = closePacket { carriedTransmit = packet }
            return
        case .draining, .terminated:
            return
        }
        guard datagram.count > 0 else { return }
        var info = ngtcp2_pkt_info(ecn: UInt32(ecn.rawValue))
        let rv = path.withNGTCP2Path { p in
            cngtcp2_conn_read_pkt(conn, p, &info, datagram.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                  datagram.count, now.nanoseconds)
        }
        afterLibraryCall(now: now)
        if rv == 0 { return }
        try handleReadError(rv, now: now)
    }

    /// Processes one received UDP datagram (array convenience).
    public func handle(datagram: [UInt8], path: QUICPath, ecn: QUICECN = .notECT, now: QUICTime) throws(QUICEngineError) {
        var thrown: QUICEngineError?
        datagram.withUnsafeBytes { bytes in
            do throws(QUICEngineError) { try handle(datagram: bytes, path: path, ecn: ecn, now: now) } catch { thrown = error }
        }
        if let thrown { throw thrown }
    }

    private func handleReadError(_ rv: Int32, now: QUICTime) throws(QUICEngineError) {
        switch rv {
        case NGTCP2_ERR_DRAINING:
            enterDraining(now: now)
            return
        case NGTCP2_ERR_DROP_CONN:
            terminate(QUICCloseReason(kind: .transport, code: UInt64(NGTCP2_PROTOCOL_VIOLATION), reason: "connection dropped",
                                      initiatedByPeer: false))
            throw .library("ngtcp2_conn_read_pkt", rv)
        case NGTCP2_ERR_RECV_VERSION_NEGOTIATION:
            terminate(QUICCloseReason(kind: .versionNegotiation, code: 0, reason: "no common QUIC version",
                                      initiatedByPeer: true))
            throw .library("ngtcp2_conn_read_pkt", rv)
        case NGTCP2_ERR_RETRY:
            // A server's first Initial that needs address validation: dropped; the client sends it again.
            return
        default:
            // ngtcp2 has already dropped, returning 0, what QUIC drops silently (undecryptable,
            // malformed or stray packets). Anything else is a connection error (RFC 9000 §11.1):
            // a peer past its stream limit, its flow-control window or a stream's final size, or
            // with a DATAGRAM over max_datagram_frame_size, is answered with CONNECTION_CLOSE
            // carrying the matching transport error, never left to resend forever.
            failConnection(libraryError: rv, now: now)
            if let violation = QUICEngineError.peerViolation(rv) { throw violation }
            throw .library("ngtcp2_conn_read_pkt", rv)
        }
    }

    /// Runs expired timers: loss detection, ACK delay, pacing, idle and handshake timeouts,
    /// and the end of the closing or draining period.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_handle_expiry`.
    public func handleTimeout(now: QUICTime) {
        guard let conn else { return }
        switch state {
        case .open:
            let rv = ngtcp2_conn_handle_expiry(conn, now.nanoseconds)
            afterLibraryCall(now: now)
            lastExpiryHandled = now
            switch rv {
            case 0:
                break
            case NGTCP2_ERR_IDLE_CLOSE:
                terminate(QUICCloseReason(kind: .idleTimeout, code: 0, reason: "idle timeout", initiatedByPeer: false))
            case NGTCP2_ERR_HANDSHAKE_TIMEOUT:
                // Said, not silent: a peer that heard us while its answers were lost (UDP
                // blocked one way) ends its side now instead of at its idle timeout, releasing
                // what the connection held there.
                pendingClose = (NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_TRANSPORT.rawValue, UInt64(NGTCP2_NO_ERROR), Array("handshake timeout".utf8))
                reportClose(QUICCloseReason(kind: .handshakeTimeout, code: 0, reason: "handshake timeout", initiatedByPeer: false))
            default:
                failConnection(libraryError: rv, now: now)
            }
        case .closing(let deadline), .draining(let deadline):
            if now >= deadline { state = .terminated }
        case .terminated:
            break
        }
    }

    /// When the driver must call ``handleTimeout(now:)`` next; nil once terminated.
    ///
    /// Includes ngtcp2's pacing deadline (`ngtcp2_conn_get_expiry`): when
    /// ``pollTransmit(now:)`` returned nil while data is queued, this is when sending resumes.
    public var nextTimeout: QUICTime? {
        switch state {
        case .open:
            guard let conn else { return nil }
            let expiry = QUICTime(nanoseconds: ngtcp2_conn_get_expiry(conn))
            // ngtcp2 0.12 reports some deadlines (retired connection IDs) that handle_expiry only
            // acts on strictly after them; never ask to be woken twice for the same instant.
            if let last = lastExpiryHandled, expiry <= last { return QUICTime(nanoseconds: last.nanoseconds + 1) }
            return expiry
        case .closing(let deadline), .draining(let deadline):
            return deadline
        case .terminated:
            return nil
        }
    }

    /// Whether the connection is fully finished (closing/draining period over, or closed
    /// without one): the driver can drop it and its connection IDs.
    public var isTerminated: Bool {
        if case .terminated = state { return true }
        return false
    }

    /// Whether the connection is closing, draining or terminated: no new application data moves.
    public var isClosed: Bool {
        if case .open = state { return pendingClose != nil }
        return true
    }

    /// A keep-alive holds the path open for this side's own idle timeout. A peer that advertised a
    /// shorter one asked for idle connections to close sooner; PINGs every `keepAliveInterval`
    /// would overrule it whenever the interval is under three probe timeouts (a long path, a
    /// loaded machine) and not otherwise. So they stop, and the smaller timeout holds on both sides.
    private func stopKeepAliveIfPeerIdlesSooner(_ conn: OpaquePointer) {
        guard configuration.keepAliveInterval != nil,
              let remote = ngtcp2_conn_get_remote_transport_params(conn)?.pointee,
              remote.max_idle_timeout != 0,
              remote.max_idle_timeout < configuration.idleTimeout.quicNanoseconds else { return }
        ngtcp2_conn_set_keep_alive_timeout(conn, 0) // 0 disables it (ngtcp2 0.12)
    }

    /// Whether the TLS handshake has completed (`ngtcp2_conn_get_handshake_completed`).
    public var isHandshakeComplete: Bool { handshakeReported }

    // MARK: - Outputs

    /// Bytes a buffer given to ``pollTransmit(now:into:)`` should offer for a full batch:
    /// as many packets as one GSO send carries (at most 64 segments, 64 000 bytes).
    public var transmitCapacity: Int {
        guard let conn else { return 1200 }
        let maxUDP = ngtcp2_conn_get_max_tx_udp_payload_size(conn)
        return maxUDP * packetsPerBatch(maxUDP: maxUDP)
    }

    /// Linux's limits for one UDP_SEGMENT send: 64 segments (UDP_MAX_SEGMENTS), and one IP
    /// datagram's worth of bytes in all.
    static let maximumGSOSegments = 64
    static let maximumGSOBytes = 64_000

    /// Most packets of `maxUDP` bytes in one batch: the configuration's limit within Linux's.
    private func packetsPerBatch(maxUDP: Int) -> Int {
        max(1, min(configuration.maxSegmentsPerTransmit, Self.maximumGSOSegments, Self.maximumGSOBytes / max(maxUDP, 1)))
    }

    /// Writes the next batch of datagrams to send into `buffer`, back to back, and says where
    /// they go; nil when there is nothing to send now (idle, congestion-limited, or waiting
    /// for the pacing timer).
    ///
    /// Call it repeatedly until it returns nil after every input. A batch holds up to
    /// ``QUICConfiguration/maxSegmentsPerTransmit`` packets for one path and ECN codepoint,
    /// all of ``QUICTransmitInfo/segmentSize`` bytes except possibly the last (one GSO send).
    /// Writing straight into the caller's buffer (a socket buffer) spares a copy and an
    /// allocation per batch. `buffer` must hold at least one full-size packet;
    /// ``transmitCapacity`` is what a full batch takes.
    /// The corresponding ngtcp2 functions are `ngtcp2_conn_writev_stream`,
    /// `ngtcp2_conn_writev_datagram`, `ngtcp2_conn_write_connection_close` and
    /// `ngtcp2_conn_update_pkt_tx_time`.
    public func pollTransmit(now: QUICTime, into buffer: UnsafeMutableRawBufferPointer) -> QUICTransmitInfo? {
        if let carried = carriedTransmit {
            precondition(buffer.count >= carried.data.count, "pollTransmit: buffer smaller than one packet")
            carriedTransmit = nil
            buffer.copyBytes(from: carried.data)
            count(carried.info)
            return carried.info
        }
        guard let conn, case .open = state else { return nil }
        if let close = pendingClose {
            pendingClose = nil
            return writeClosePacket(kind: close.kind, code: close.code, reason: close.reason, now: now, into: buffer)
        }

        let before = Self.statistics(conn)
        let pathMax = packetSizeLimit(conn, probeTimeouts: before.pto_count, now: now)
        let maxUDP = packetSizeFallback.limit(ngtcp2_conn_get_max_tx_udp_payload_size(conn))
        precondition(buffer.count >= maxUDP, "pollTransmit: buffer smaller than one packet")
        let quantum = min(ngtcp2_conn_get_send_quantum(conn), pacedBatchBytes(maxUDP: maxUDP))
        // The buffer may offer more than transmitCapacity (allocators round up): the batch
        // limit still holds.
        let maxPackets = max(1, min(packetsPerBatch(maxUDP: maxUDP), quantum / max(maxUDP, 1), buffer.count / maxUDP))
        compactSendQueue()
        let inFlightBefore = before.bytes_in_flight

        var used = 0
        var segmentSize = 0
        var packets = 0
        var batchPath: QUICPath?
        var batchECN = QUICECN.notECT
        var failure: Int32 = 0

        while packets < maxPackets {
            var ps = ngtcp2_path_storage()
            ngtcp2_path_storage_zero(&ps)
            var info = ngtcp2_pkt_info()
            let dest = buffer.baseAddress!.advanced(by: used).assumingMemoryBound(to: UInt8.self)
            let n = writePacket(conn: conn, path: &ps.path, info: &info, dest: dest, capacity: maxUDP, now: now)
            if n < 0 { failure = Int32(n); break }
            if n == 0 { break }
            let length = Int(n)
            let packetPath = QUICPath(ps.path) ?? currentPath
            let packetECN = QUICECN(rawValue: UInt8(truncatingIfNeeded: info.ecn))
            if packets == 0 {
                batchPath = packetPath
                batchECN = packetECN
                segmentSize = length
            } else if packetPath != batchPath || packetECN != batchECN || length > segmentSize
                        || (segmentSize > pathMax && length != segmentSize) {
                // Cannot join this GSO batch: hand it out on the next poll.
                carriedTransmit = QUICTransmit(
                    QUICTransmitInfo(path: packetPath, ecn: packetECN, byteCount: length, segmentSize: length, segmentCount: 1),
                    data: Array(UnsafeRawBufferPointer(start: dest, count: length)))
                break
            }
            used += length
            packets += 1
            if length < segmentSize { break } // a short packet must be the batch's last
        }
        pace(conn, inFlightBefore: inFlightBefore, now: now)
        afterLibraryCall(now: now)

        if failure != 0 {
            failConnection(libraryError: failure, now: now)
            if let close = pendingClose {
                pendingClose = nil
                return writeClosePacket(kind: close.kind, code: close.code, reason: close.reason, now: now, into: buffer)
            }
            return nil
        }
        guard packets > 0, let batchPath else { return nil }
        let info = QUICTransmitInfo(path: batchPath, ecn: batchECN, byteCount: used, segmentSize: segmentSize, segmentCount: packets)
        count(info)
        return info
    }

    /// The next datagrams to send in an array of their own (for tests and drivers that do
    /// not write into socket buffers); see ``pollTransmit(now:into:)``.
    public func pollTransmit(now: QUICTime) -> QUICTransmit? {
        var info: QUICTransmitInfo?
        let data = [UInt8](unsafeUninitializedCapacity: transmitCapacity) { buffer, initialized in
            info = pollTransmit(now: now, into: UnsafeMutableRawBufferPointer(buffer))
            initialized = info?.byteCount ?? 0
        }
        return info.map { QUICTransmit($0, data: data) }
    }

    /// The largest packet the path takes now (`ngtcp2_conn_get_path_max_tx_udp_payload_size`),
    /// under ``PacketSizeFallback``'s ceiling once the handshake is done; reports the ceiling's
    /// changes as ``QUICEvent/packetSizeLimited(_:)``.
    private func packetSizeLimit(_ conn: OpaquePointer, probeTimeouts: Int, now: QUICTime) -> Int {
        let pathMax = ngtcp2_conn_get_path_max_tx_udp_payload_size(conn)
        if handshakeReported,
           let change = packetSizeFallback.update(packetSize: pathMax, probeTimeouts: probeTimeouts, now: now) {
            switch change {
            case .limited(let size): recordEvent(.packetSizeLimited(size))
            case .lifted: recordEvent(.packetSizeLimited(nil))
            }
        }
        return packetSizeFallback.limit(pathMax)
    }

    /// How long one batch may last at the pacing rate: the packets of a batch leave together,
    /// so a batch is a burst. Linux's TCP sizes its segmentation bursts to about 1 ms at its
    /// pacing rate the same way (`tcp_tso_autosize`).
    static let batchDuration = 1_000_000.0

    /// Most bytes one batch may carry: ``batchDuration`` at the pacing rate, at least two packets.
    ///
    /// ngtcp2 0.12's send quantum for BBR v2 is the pacing rate times the minimum RTT (not
    /// 1 ms), between 10 packets and 64 KiB: on a 10 Mbit/s path of 80 ms, 44 packets left at
    /// one instant, 50 ms of the link's time, into a queue of 10 ms; a third of the packets
    /// were dropped and the transfer moved at a third of the link's rate (docs/benchmarks.md,
    /// "Bursts on a thin path"). The bound is ours, not the library's, so it holds whichever
    /// controller runs.
    private func pacedBatchBytes(maxUDP: Int) -> Int {
        let bytes = pacingRate * Self.batchDuration
        guard bytes > 0, bytes < Double(Self.maximumGSOBytes) else { return Int.max }
        return max(2 * maxUDP, Int(bytes))
    }

    /// Starts the pacing interval of the batch just written (`ngtcp2_conn_update_pkt_tx_time`)
    /// where the previous batch's ended, not at `now`.
    ///
    /// ngtcp2 0.12 sets its next send time to "the time given + this batch's bytes / pacing
    /// rate" and lets a batch go up to 1 ms early. Given `now`, a driver that polls in a loop
    /// got every batch whose interval is under 1 ms (64 packets above ~90 MB/s) at once: the
    /// whole congestion window left in one burst, with no acknowledgement read in between, and
    /// every packet of it carried the same delivery snapshot, which ngtcp2 0.12's rate sampler
    /// turns into delivery-rate samples up to twice the link's (docs/benchmarks.md, "Why
    /// QUIC overshot the emulated WAN"). Starting each interval where the last one ended keeps
    /// the average at the pacing rate and bursts within 1 ms. Only bytes that count as in
    /// flight carry the debt forward: acknowledgements are not congestion-controlled, and a
    /// receiver's stream of them must not hold back its window updates.
    private func pace(_ conn: OpaquePointer, inFlightBefore: UInt64, now: QUICTime) {
        let start = max(now, pacedUntil)
        ngtcp2_conn_update_pkt_tx_time(conn, start.nanoseconds)
        let s = Self.statistics(conn)
        sampleUnqueuedRTTExcess(s)
        let paced = s.bytes_in_flight > inFlightBefore ? s.bytes_in_flight - inFlightBefore : 0
        guard paced > 0 else { return }
        highestDeliveryRate = max(highestDeliveryRate, s.delivery_rate_sec)
        // ngtcp2's own fallback when the controller sets no rate (RFC 9002 §7.7): cwnd / srtt × 1.25.
        var bytesPerNanosecond = s.pacing_rate > 0
            ? min(s.pacing_rate, startUpPacingCeiling(s)) : Double(s.cwnd) / Double(max(s.smoothed_rtt, 1)) * 1.25
        if let limit = pacingRateUnderInFlightCap(s, now: now) { bytesPerNanosecond = min(bytesPerNanosecond, limit) }
        guard bytesPerNanosecond > 0, bytesPerNanosecond.isFinite else { return }
        pacingRate = bytesPerNanosecond
        pacedUntil = start.advanced(by: .nanoseconds(Int64(min(Double(paced) / bytesPerNanosecond, 1e12))))
    }

    /// BBR's start-up gain (ngtcp2 0.12's BBR; its BBR v2 uses 2.77).
    static let startUpPacingGain = 2.89

    /// The fastest BBR may pace, in bytes per nanosecond: the start-up gain times the larger of
    /// what the congestion window lets out in a smoothed RTT and the highest delivery rate
    /// measured; unbounded before the first RTT sample.
    ///
    /// The BBR draft starts at the initial window over the smoothed RTT (1 ms when there is none
    /// yet), and start-up only ever raises that rate. ngtcp2 0.12 starts its controllers before
    /// the handshake measures an RTT, so both BBRs paced start-up at the initial window per
    /// millisecond, 40 MB/s on any path: each acknowledgement let the window's growth out at
    /// once. On a 10 Mbit/s path of 80 ms with a 10 ms queue, 556 of 3 579 packets were
    /// dropped with batches sized to the pacing rate, 481 of 3 523 with this too
    /// (docs/benchmarks.md, "Bursts on a thin path"). BBR's own rate, a gain of at most 2.89
    /// over an estimate made of delivery-rate samples, always lies below, and stands.
    private func startUpPacingCeiling(_ s: ngtcp2_conn_stat) -> Double {
        guard s.min_rtt != UInt64.max, s.smoothed_rtt > 0 else { return .infinity }
        let nominal = max(Double(s.cwnd) / Double(s.smoothed_rtt), Double(highestDeliveryRate) / 1e9)
        return Self.startUpPacingGain * nominal
    }

    /// The in-flight cap never goes below this, so that a start-up whose estimate still lags
    /// is not throttled; small enough to sit under a 40 ms, 300 Mbit/s path's BDP plus queue.
    static let minimumInFlightCap = 1 << 20

    /// The in-flight cap's floor once more than 2 % of the packets were lost with no queue.
    ///
    /// ngtcp2 0.12's BBR v2 cuts its in-flight ceiling (`inflight_hi`) to 0.7 of its target
    /// after every rate sample that lost more than 2 % and was not application-limited, and
    /// raises it only while the window is full. Random loss above 2 % (a poor radio link) makes
    /// every round such a sample: on a 40 ms, 50 Mbit/s path with 5-10 % loss, whose
    /// bandwidth-delay product (250 KB) lies far under ``minimumInFlightCap``, the window fell
    /// to 3-4 packets and a transfer to 0.2-1.4 MB/s where TCP moved 5 (docs/benchmarks.md,
    /// "Heavy random loss on a short path"). A cap that binds holds new data back while the
    /// window has room, so ngtcp2 marks the samples application-limited and BBR v2 keeps its
    /// ceiling, as on long paths, where the cap already lies under the window. Without such
    /// loss the floor stays ``minimumInFlightCap``, which start-up needs (see
    /// ``noteHeavyLoss(_:)``).
    static let heavyLossMinimumInFlightCap = 64 << 10

    /// The cap's bandwidth-delay products until the pipe is found full (when the configured
    /// ones are fewer). In start-up the delivery-rate estimate trails what is sent by a round
    /// trip, so a cap of 1.25 estimates let what is in flight grow by only a quarter a round
    /// once past ``minimumInFlightCap``: six round trips from 1 MiB to a 500 Mbit/s × 50 ms
    /// path's 3.9 MB, where start-up's doubling takes two. 1.5 takes three or four, and ends
    /// start-up at most half a bandwidth-delay product over the pipe, which a queue of half a
    /// BDP (bench/'s 300 ms path) still holds; 2 overflowed the 50 ms path's queue
    /// (docs/benchmarks.md, "Start-up under the in-flight cap").
    static let startUpInFlightProducts = 1.5

    /// Whether ``QUICConfiguration/maxInFlightBandwidthDelayProducts`` holds new stream data back now.
    private func inFlightCapReached(_ conn: OpaquePointer) -> Bool {
        let s = Self.statistics(conn)
        guard let cap = inFlightCap(s) else { return false }
        return Double(s.bytes_in_flight) >= cap
    }

    /// With the in-flight cap, once the delivery-rate estimate has stopped growing: the cap's
    /// bytes spread over one of its products' delay (bytes per nanosecond); nil before, and
    /// without the cap.
    ///
    /// The cap holds new data back while cwnd has room, so ngtcp2 0.12 ends each flight with an
    /// undersized packet and marks the connection application-limited; BBR v2 ignores such
    /// rounds when it looks for a full pipe, so it never left start-up and paced every capped
    /// flight at start-up's 2.77 times the estimate. On a path whose queue holds less than about
    /// 0.64 of that flight (300 ms at 200 Mbit/s with a 150 ms queue) the burst overflowed it:
    /// 8 % of the packets dropped (docs/benchmarks.md, "The 300 ms path: BBR v2 held in
    /// start-up by the in-flight cap").
    /// This finds the full pipe as BBR would (three rounds without 25 % growth) and then paces
    /// at the cap's rate; before it, start-up's pacing is what lets the estimate grow quickly.
    private func pacingRateUnderInFlightCap(_ s: ngtcp2_conn_stat, now: QUICTime) -> Double? {
        guard let cap = inFlightCap(s) else { return nil }
        if !pipeFilled && now >= roundEnds {
            roundEnds = now.advanced(by: .nanoseconds(Int64(clamping: max(s.smoothed_rtt, s.min_rtt))))
            if Double(s.delivery_rate_sec) >= 1.25 * Double(fullRateEstimate) {
                fullRateEstimate = s.delivery_rate_sec
                roundsWithoutGrowth = 0
            } else {
                roundsWithoutGrowth += 1
                pipeFilled = roundsWithoutGrowth >= 3
            }
        }
        return pipeFilled ? cap / cappedDelay(s) : nil
    }

    /// The bytes ``QUICConfiguration/maxInFlightBandwidthDelayProducts`` lets be in flight, once
    /// there is a rate sample and a minimum RTT; nil without them or without the setting.
    ///
    /// A product's delay is the minimum RTT plus what the smoothed RTT exceeded it by while less
    /// than ``minimumInFlightCap`` was in flight, too little to queue on any path the cap
    /// matters on. On a path whose delay varies (radio links, a jittery emulated path) a busy
    /// flow's packets take longer than the rare fastest one, with no queue of this sender's: a
    /// cap on the minimum alone then holds less in flight than the pipe needs, the rate sample
    /// it caps falls, and the next cap with it, round after round down to the floor (0.62 of
    /// the link where TCP moved 0.78; docs/benchmarks.md, "A path whose delay varies").
    /// Measured only while nothing could queue, the excess never grows with what this sender
    /// puts in flight.
    private func inFlightCap(_ s: ngtcp2_conn_stat) -> Double? {
        guard var products = configuration.maxInFlightBandwidthDelayProducts,
              s.delivery_rate_sec > 0, s.min_rtt != UInt64.max, s.min_rtt > 0 else { return nil }
        if !pipeFilled { products = max(products, Self.startUpInFlightProducts) }
        let floor = heavyLossSeen ? Self.heavyLossMinimumInFlightCap : Self.minimumInFlightCap
        return max(Double(floor), products * Double(s.delivery_rate_sec) * cappedDelay(s) / 1e9)
    }

    /// The delay of one of the in-flight cap's bandwidth-delay products, in nanoseconds.
    ///
    /// Under heavy random loss, the minimum RTT alone. The excess is measured in start-up, and
    /// where one bandwidth-delay product lies far under ``minimumInFlightCap`` (40 ms at
    /// 50 Mbit/s) start-up has queued by then: the excess took in 17 ms of this sender's own
    /// queue, the cap kept that queue standing, and BBR v2, seeing no RTT near the minimum for
    /// 5 s, went to ProbeRTT. Refilling the pipe after it at 10 % loss, BBR found the pipe full
    /// and cut its window with every lossy round: 0.5 MB/s instead of 5.5 (docs/benchmarks.md,
    /// "Heavy random loss past the first ProbeRTT"). Measuring the excess only below one product
    /// instead cost the path whose delay varies, where the excess is needed, 14-20 % of its rate.
    private func cappedDelay(_ s: ngtcp2_conn_stat) -> Double {
        Double(s.min_rtt) + (heavyLossSeen ? 0 : Double(unqueuedRTTExcess))
    }

    /// Before the pipe is full, while less than ``minimumInFlightCap`` is in flight: how far the
    /// smoothed RTT stays above the minimum, less an eighth of the minimum: what delayed
    /// acknowledgements and timers add on a path of fixed delay (1-7 ms on bench/'s emulated
    /// 40-300 ms paths; 16-27 ms on its path of 20 ± 10 ms each way). Where one bandwidth-delay
    /// product lies far under ``minimumInFlightCap`` it takes in start-up's own queue too, which
    /// is why ``cappedDelay(_:)`` leaves it out under heavy loss.
    private func sampleUnqueuedRTTExcess(_ s: ngtcp2_conn_stat) {
        guard !pipeFilled, s.bytes_in_flight < Self.minimumInFlightCap, s.min_rtt != UInt64.max else { return }
        let variation = s.smoothed_rtt > s.min_rtt ? s.smoothed_rtt - s.min_rtt : 0
        unqueuedRTTExcess = variation > s.min_rtt / 8 ? variation - s.min_rtt / 8 : 0
    }

    private static func statistics(_ conn: OpaquePointer) -> ngtcp2_conn_stat {
        var s = ngtcp2_conn_stat()
        cngtcp2_conn_get_conn_stat(conn, &s)
        return s
    }

    private func count(_ info: QUICTransmitInfo) {
        counters.packetsSent += UInt64(info.segmentCount)
        counters.bytesSent += UInt64(info.byteCount)
    }

    /// Writes one QUIC packet, coalescing datagrams and stream frames of several streams.
    /// Returns its length, 0 if nothing can be sent, or a fatal ngtcp2 error.
    private func writePacket(conn: OpaquePointer, path: UnsafeMutablePointer<ngtcp2_path>,
                             info: UnsafeMutablePointer<ngtcp2_pkt_info>, dest: UnsafeMutablePointer<UInt8>,
                             capacity: Int, now: QUICTime) -> Int {
        let connectionCredit = ngtcp2_conn_get_max_data_left(conn)
        let newDataHeld = inFlightCapReached(conn)
        var candidateIndex = 0
        let candidates = sendQueue.count
        let start = candidates == 0 ? 0 : roundRobin % candidates
        roundRobin &+= 1
        var triedDatagram = false

        while true {
            // Unreliable datagrams go first: they are the latency-sensitive traffic.
            if !triedDatagram, outgoingDatagramHead < outgoingDatagrams.count {
                // Queued before the packet size fell back: it would never fit, and would hold
                // back everything behind it.
                if packetSizeFallback.ceiling != nil,
                   outgoingDatagrams[outgoingDatagramHead].count > maxDatagramPayloadSize ?? 0 {
                    popOutgoingDatagram()
                    counters.datagramsDroppedOut += 1
                    continue
                }
                var accepted: Int32 = 0
                let id = nextDatagramID
                let n = outgoingDatagrams[outgoingDatagramHead].withUnsafeBytes { bytes in
                    var vec = ngtcp2_vec(base: UnsafeMutablePointer(mutating: bytes.baseAddress?.assumingMemoryBound(to: UInt8.self)),
                                         len: bytes.count)
                    return cngtcp2_conn_writev_datagram(conn, path, info, dest, capacity, &accepted,
                                                        UInt32(NGTCP2_WRITE_DATAGRAM_FLAG_MORE), id, &vec, 1,
                                                        now.nanoseconds)
                }
                if accepted != 0 {
                    popOutgoingDatagram()
                    nextDatagramID &+= 1
                }
                if n == Int(NGTCP2_ERR_WRITE_MORE) { continue }
                if n == Int(NGTCP2_ERR_INVALID_ARGUMENT) || n == Int(NGTCP2_ERR_INVALID_STATE) {
                    // Too large for the peer, or the peer does not take datagrams: drop it.
                    if accepted == 0 { popOutgoingDatagram(); counters.datagramsDroppedOut += 1 }
                    triedDatagram = true
                    continue
                }
                if n < 0 { return n }
                if n > 0 { return n }
                // Returned 0: congestion-limited, or it did not fit this packet. Try other frames.
                triedDatagram = true
                if accepted == 0 && outgoingDatagramHead < outgoingDatagrams.count { return 0 }
                continue
            }

            var streamID: Int64 = -1
            var stream: StreamState?
            while candidateIndex < candidates {
                let id = sendQueue[(start + candidateIndex) % candidates]
                candidateIndex += 1
                guard sendQueueMembers.contains(id), let s = streams[id], s.hasPendingSend, !s.flowBlocked else { continue }
                if s.send!.unsentBytes > 0 && (connectionCredit == 0 || newDataHeld) { continue }
                streamID = id
                stream = s
                break
            }

            var flags = UInt32(NGTCP2_WRITE_STREAM_FLAG_NONE)
            var vecCount = 0
            var offeredAll = true
            if let stream, let send = stream.send {
                vecCount = send.unsentVectors(into: streamVectors)
                let offered = streamVectors.prefix(vecCount).reduce(0) { $0 + $1.len }
                offeredAll = offered == send.unsentBytes
                flags = UInt32(NGTCP2_WRITE_STREAM_FLAG_MORE)
                if stream.finRequested && offeredAll { flags |= UInt32(NGTCP2_WRITE_STREAM_FLAG_FIN) }
            }
            var written: ngtcp2_ssize = -1
            let n = cngtcp2_conn_writev_stream(conn, path, info, dest, capacity, &written, flags, streamID,
                                               vecCount > 0 ? streamVectors.baseAddress : nil, vecCount, now.nanoseconds)
            if let stream, let send = stream.send, written >= 0 {
                send.markSent(written)
                if flags & UInt32(NGTCP2_WRITE_STREAM_FLAG_FIN) != 0 && send.unsentBytes == 0 { stream.finSent = true }
                if !stream.hasPendingSend { sendQueueMembers.remove(streamID) }
            }
            switch n {
            case Int(NGTCP2_ERR_WRITE_MORE):
                continue
            case Int(NGTCP2_ERR_STREAM_DATA_BLOCKED):
                stream?.flowBlocked = true
                continue
            case Int(NGTCP2_ERR_STREAM_SHUT_WR), Int(NGTCP2_ERR_STREAM_NOT_FOUND):
                // We did not reset it, so the peer sent STOP_SENDING (ngtcp2 0.12 answers it with
                // RESET_STREAM by itself and has no callback for it).
                if let stream, !stream.sendClosed {
                    stream.sendClosed = true
                    recordEvent(.streamStopSending(stream.id, errorCode: nil))
                }
                sendQueueMembers.remove(streamID)
                continue
            default:
                return n
            }
        }
    }

    /// Writes CONNECTION_CLOSE into `buffer` and keeps a copy to answer packets that arrive
    /// during the closing period.
    private func writeClosePacket(kind: UInt32, code: UInt64, reason: [UInt8], now: QUICTime,
                                  into buffer: UnsafeMutableRawBufferPointer) -> QUICTransmitInfo? {
        guard let conn else { return nil }
        let pto = ngtcp2_conn_get_pto(conn)
        state = .closing(deadline: now.advanced(by: .nanoseconds(Int64(clamping: 3 * pto))))
        if ngtcp2_conn_is_in_closing_period(conn) != 0 || ngtcp2_conn_is_in_draining_period(conn) != 0 { return nil }
        var ps = ngtcp2_path_storage()
        ngtcp2_path_storage_zero(&ps)
        var info = ngtcp2_pkt_info()
        var reasonCopy = reason
        let n = reasonCopy.withUnsafeMutableBufferPointer { r in
            var ccerr = ngtcp2_connection_close_error(
                type: ngtcp2_connection_close_error_code_type(kind), error_code: code, frame_type: 0,
                reason: r.baseAddress, reasonlen: r.count)
            return cngtcp2_conn_write_connection_close(
                conn, &ps.path, &info, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self),
                min(buffer.count, packetSizeFallback.limit(ngtcp2_conn_get_max_tx_udp_payload_size(conn))), &ccerr, now.nanoseconds)
        }
        guard n > 0 else { return nil }
        let transmitInfo = QUICTransmitInfo(
            path: QUICPath(ps.path) ?? currentPath, ecn: QUICECN(rawValue: UInt8(truncatingIfNeeded: info.ecn)),
            byteCount: Int(n), segmentSize: Int(n), segmentCount: 1)
        closePacket = QUICTransmit(transmitInfo, data: Array(UnsafeRawBufferPointer(rebasing: buffer[..<Int(n)])))
        count(transmitInfo)
        return transmitInfo
    }

    /// Returns the next event, or nil when none is queued.
    public func pollEvent() -> QUICEvent? {
        guard eventHead < events.count else { return nil }
        let event = events[eventHead]
        eventHead += 1
        if eventHead == events.count {
            events.removeAll(keepingCapacity: true)
            eventHead = 0
        } else if eventHead > 1024 && eventHead * 2 > events.count {
            events.removeFirst(eventHead)
            eventHead = 0
        }
        if case .datagramReceived = event { queuedIncomingDatagrams -= 1 }
        return event
    }

    // MARK: - Streams

    /// Opens a stream; returns nil when the peer's stream limit is reached
    /// (wait for ``QUICEvent/streamsAvailable(bidirectional:)``).
    /// The corresponding ngtcp2 functions are `ngtcp2_conn_open_bidi_stream` and `ngtcp2_conn_open_uni_stream`.
    public func openStream(bidirectional: Bool = true) throws(QUICEngineError) -> QUICStreamID? {
        guard let conn, !isClosed else { throw QUICEngineError(.connectionClosed, "connection is closed") }
        var id: Int64 = -1
        let rv = bidirectional ? ngtcp2_conn_open_bidi_stream(conn, &id, nil) : ngtcp2_conn_open_uni_stream(conn, &id, nil)
        if rv == NGTCP2_ERR_STREAM_ID_BLOCKED { return nil }
        guard rv == 0 else { throw .library(bidirectional ? "ngtcp2_conn_open_bidi_stream" : "ngtcp2_conn_open_uni_stream", rv) }
        streams[id] = StreamState(id: QUICStreamID(rawValue: id), canSend: true, canReceive: bidirectional, blocks: sendBlocks)
        return QUICStreamID(rawValue: id)
    }

    /// Queues bytes on a stream; returns how many were accepted.
    ///
    /// The engine keeps at most ``QUICConfiguration/streamSendBufferLimit`` unacknowledged bytes
    /// (more on a path that needs it, see ``QUICConfiguration/maxStreamSendBuffer``), shared by
    /// the connection's streams, of which each may hold 64 KiB whatever the others hold.
    /// When fewer than `bytes.count` are accepted, wait for ``QUICEvent/streamWritable(_:)``
    /// and offer the rest. With `finish`, the stream's
    /// sending side ends after these bytes, but only if all of them were accepted.
    public func write(stream: QUICStreamID, bytes: UnsafeRawBufferPointer, finish: Bool = false) throws(QUICEngineError) -> Int {
        let s = try sendableStream(stream)
        let accepted = s.send!.append(bytes, limit: sendBufferLimit(for: s))
        if accepted < bytes.count {
            s.wantsWritable = true
            writersWaiting.insert(stream.rawValue)
        } else if finish {
            s.finRequested = true
        }
        enqueueForSending(s)
        return accepted
    }

    /// Unacknowledged bytes a stream may hold on this path: the congestion window plus one
    /// bandwidth-delay product, between ``QUICConfiguration/streamSendBufferLimit`` and `ceiling`.
    private func pathSendBufferLimit(_ s: ngtcp2_conn_stat, ceiling: Int) -> Int {
        let floor = configuration.streamSendBufferLimit
        let seconds = Double(s.smoothed_rtt) / 1e9
        let product = Double(s.delivery_rate_sec) * seconds
        let path = Double(s.cwnd) + (product.isFinite ? product : 0)
        return path >= Double(ceiling) ? ceiling : max(floor, Int(path))
    }

    /// What `s` may hold: what one stream alone may (``ownSendBufferLimit(for:)``) less what the
    /// connection's other streams hold, but never less than ``sendBufferFloorPerStream``. So the
    /// streams of a connection share one stream's worth of memory, where each had its own: a
    /// sender of many small files keeps 8 streams busy, and with a receiver slower than the
    /// network each filled its 4 MiB, 32 MiB in all (10 000 files of 4 KiB over loopback: the
    /// sender's peak 70-76 MiB, 54-56 with the sharing).
    /// The floor lets every stream move (a control message never waits for file data to be
    /// acknowledged), and bounds what the sharing can add to the limit: a floor per stream.
    private func sendBufferLimit(for s: StreamState) -> Int {
        let own = ownSendBufferLimit(for: s)
        let othersHold = sendBlocks.bytesInUse - (s.send?.heldBlockBytes ?? 0)
        return min(own, max(Self.sendBufferFloorPerStream, own - othersHold))
    }

    /// What a stream may always hold, whatever the others hold: four blocks.
    static let sendBufferFloorPerStream = 4 * StreamSendBuffer.blockSize

    /// What `s` alone may hold: the path's limit, plus what a loss pins, but no further than the
    /// peer's flow control admits.
    ///
    /// The buffer spans from the lowest unacknowledged byte, so after a loss everything sent
    /// after it stays until its retransmission is acknowledged, a round trip or two later. On a
    /// lossy path there is almost always such a hole, and without counting what it pins the
    /// buffer filled with acknowledged bytes while nothing new could be queued: the sender went
    /// idle for want of data (docs/benchmarks.md, "QUIC under random loss"). A slow reader stops
    /// the peer's window, so what is sent plus the credit left holds the sender at the floor.
    private func ownSendBufferLimit(for s: StreamState) -> Int {
        guard let conn, let ceiling = configuration.maxStreamSendBuffer else { return configuration.streamSendBufferLimit }
        let statistics = Self.statistics(conn)
        let path = pathSendBufferLimit(statistics, ceiling: ceiling)
        guard let send = s.send else { return path }
        let sentSpan = UInt64(send.bufferedBytes - send.unsentBytes)
        let inFlight = statistics.bytes_in_flight
        let pinnedByLoss = sentSpan > inFlight ? sentSpan - inFlight : 0
        let wanted = min(UInt64(ceiling), UInt64(path) + pinnedByLoss)
        let credit = min(ngtcp2_conn_get_max_data_left(conn),
                         ngtcp2_conn_get_max_stream_data_left(conn, s.id.rawValue))
        let admitted = sentSpan.addingReportingOverflow(credit)
        let limit = admitted.overflow ? wanted : min(wanted, admitted.partialValue)
        return max(configuration.streamSendBufferLimit, Int(limit))
    }

    /// Queues bytes on a stream (array convenience); same contract as the buffer-pointer overload.
    public func write(stream: QUICStreamID, bytes: [UInt8], finish: Bool = false) throws(QUICEngineError) -> Int {
        var result: Result<Int, QUICEngineError> = .success(0)
        bytes.withUnsafeBytes { raw in
            do throws(QUICEngineError) { result = .success(try write(stream: stream, bytes: raw, finish: finish)) } catch { result = .failure(error) }
        }
        return try result.get()
    }

    /// Ends the stream's sending side after the bytes already written (sends FIN).
    public func finish(stream: QUICStreamID) throws(QUICEngineError) {
        let s = try sendableStream(stream)
        s.finRequested = true
        enqueueForSending(s)
    }

    /// Abandons the stream's sending side with RESET_STREAM; unsent and unacknowledged bytes are dropped.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_shutdown_stream_write`.
    public func reset(stream: QUICStreamID, errorCode: UInt64) throws(QUICEngineError) {
        let s = try sendableStream(stream)
        guard let conn else { return }
        let rv = ngtcp2_conn_shutdown_stream_write(conn, stream.rawValue, errorCode)
        if rv != 0 && rv != NGTCP2_ERR_STREAM_NOT_FOUND { throw .library("ngtcp2_conn_shutdown_stream_write", rv) }
        s.sendClosed = true
        sendQueueMembers.remove(stream.rawValue)
    }

    /// Asks the peer to stop sending with STOP_SENDING and discards buffered received bytes.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_shutdown_stream_read`.
    public func stopSending(stream: QUICStreamID, errorCode: UInt64) throws(QUICEngineError) {
        guard let conn, !isClosed else { throw QUICEngineError(.connectionClosed, "connection is closed") }
        guard let s = streams[stream.rawValue], !s.receiveDone else {
            throw QUICEngineError(.unknownStream, "\(stream) has no open receiving side")
        }
        let rv = ngtcp2_conn_shutdown_stream_read(conn, stream.rawValue, errorCode)
        if rv != 0 && rv != NGTCP2_ERR_STREAM_NOT_FOUND { throw .library("ngtcp2_conn_shutdown_stream_read", rv) }
        let discarded = s.receive.count
        s.receive.removeAll()
        s.receiveDone = true
        if discarded > 0 { ngtcp2_conn_extend_max_offset(conn, UInt64(discarded)) }
        forgetIfDone(s)
    }

    /// Copies buffered bytes of a stream, in order, into `buffer` (as many as fit) and returns
    /// the same amount of flow-control credit to the peer. `isFinished` is true when the bytes
    /// read end the stream: the FIN has arrived and nothing is left. An empty `buffer` only
    /// asks whether the stream is finished.
    ///
    /// This is the only place receive windows grow: a reader that stops reading stops
    /// the peer once the window (at most ``QUICConfiguration/maxStreamWindow``) is full.
    /// The corresponding ngtcp2 functions are `ngtcp2_conn_extend_max_stream_offset` and
    /// `ngtcp2_conn_extend_max_offset`.
    public func read(stream: QUICStreamID, into buffer: UnsafeMutableRawBufferPointer) throws(QUICEngineError)
        -> (byteCount: Int, isFinished: Bool) {
        guard let s = streams[stream.rawValue] else { throw QUICEngineError(.unknownStream, "\(stream) is unknown") }
        let count = s.receive.read(into: buffer)
        if count > 0, let conn, case .open = state {
            if !s.closed && !s.receiveDone {
                _ = ngtcp2_conn_extend_max_stream_offset(conn, stream.rawValue, UInt64(count))
            }
            ngtcp2_conn_extend_max_offset(conn, UInt64(count))
        }
        let finished = s.finReceived && s.receive.isEmpty
        if finished { s.receiveDone = true }
        forgetIfDone(s)
        return (count, finished)
    }

    /// Reads up to `maxLength` buffered bytes of a stream into an array of their own; see
    /// ``read(stream:into:)``.
    public func read(stream: QUICStreamID, maxLength: Int = .max) throws(QUICEngineError) -> QUICStreamRead {
        var result: (byteCount: Int, isFinished: Bool) = (0, false)
        var failure: QUICEngineError?
        let bytes = [UInt8](unsafeUninitializedCapacity: min(maxLength, readableBytes(stream: stream))) { buffer, initialized in
            do throws(QUICEngineError) {
                result = try read(stream: stream, into: UnsafeMutableRawBufferPointer(buffer))
            } catch {
                failure = error
            }
            initialized = result.byteCount
        }
        if let failure { throw failure }
        return QUICStreamRead(bytes: bytes, isFinished: result.isFinished)
    }

    /// Bytes buffered for the application on this stream (0 for unknown streams).
    public func readableBytes(stream: QUICStreamID) -> Int { streams[stream.rawValue]?.receive.count ?? 0 }

    /// Unacknowledged bytes the engine holds for this stream (0 for unknown streams).
    public func bufferedSendBytes(stream: QUICStreamID) -> Int { streams[stream.rawValue]?.send?.bufferedBytes ?? 0 }

    /// Total bytes buffered for the application over all streams.
    public var totalReadableBytes: Int { streams.values.reduce(0) { $0 + $1.receive.count } }

    /// Streams the engine currently tracks.
    public var openStreams: [QUICStreamID] { streams.keys.sorted().map(QUICStreamID.init(rawValue:)) }

    private func sendableStream(_ stream: QUICStreamID) throws(QUICEngineError) -> StreamState {
        guard !isClosed else { throw QUICEngineError(.connectionClosed, "connection is closed") }
        guard let s = streams[stream.rawValue], s.send != nil else {
            throw QUICEngineError(.unknownStream, "\(stream) has no sending side")
        }
        guard !s.sendClosed, !s.finRequested else {
            throw QUICEngineError(.invalidStreamState, "\(stream) was finished or reset")
        }
        return s
    }

    func enqueueForSending(_ s: StreamState) {
        guard s.hasPendingSend, !sendQueueMembers.contains(s.id.rawValue) else { return }
        sendQueueMembers.insert(s.id.rawValue)
        sendQueue.append(s.id.rawValue)
    }

    private func compactSendQueue() {
        if sendQueue.count > sendQueueMembers.count {
            var seen = Set<Int64>()
            sendQueue.removeAll { !sendQueueMembers.contains($0) || !seen.insert($0).inserted }
        }
    }

    private func forgetIfDone(_ s: StreamState) {
        if s.closed && (s.receiveDone || s.receive.isEmpty) {
            streams[s.id.rawValue] = nil
            sendQueueMembers.remove(s.id.rawValue)
            counters.closedStreamLoss += s.lossCount
        }
    }

    // MARK: - Channel binding

    /// A TLS exporter value (RFC 8446 section 7.5, as RFC 5705 defines the interface): a secret
    /// that both ends of this connection, and only they, compute alike, for binding an
    /// application protocol to this very connection. Available once the handshake completed.
    public func exportKeyingMaterial(label: String, context: [UInt8], length: Int) throws(QUICEngineError) -> [UInt8] {
        guard handshakeReported, let tls else { throw QUICEngineError(.invalidStreamState, "the handshake has not completed") }
        guard (1...255).contains(length) else { throw QUICEngineError(.invalidConfiguration, "exporter length \(length) out of range") }
        var output = [UInt8](repeating: 0, count: length)
        let labelBytes = Array(label.utf8)
        let rv = labelBytes.withUnsafeBufferPointer { labelBuffer in
            context.withUnsafeBufferPointer { contextBuffer in
                output.withUnsafeMutableBufferPointer { out in
                    labelBuffer.withMemoryRebound(to: CChar.self) { label in
                        contextBuffer.withMemoryRebound(to: CChar.self) { context in
                            gnutls_prf_rfc5705(tls.session, label.count, label.baseAddress, context.count, context.baseAddress,
                                               out.count, UnsafeMutableRawPointer(out.baseAddress!).assumingMemoryBound(to: CChar.self))
                        }
                    }
                }
            }
        }
        guard rv == 0 else { throw .gnutls("gnutls_prf_rfc5705", rv) }
        return output
    }

    // MARK: - Datagrams

    /// The largest payload ``sendDatagram(_:)`` accepts now; nil before the peer's transport
    /// parameters arrive or if the peer does not accept datagrams (`max_datagram_frame_size`).
    public var maxDatagramPayloadSize: Int? {
        guard let conn, let params = ngtcp2_conn_get_remote_transport_params(conn) else { return nil }
        let frameLimit = Int(clamping: params.pointee.max_datagram_frame_size)
        guard frameLimit > 0 else { return nil }
        // DATAGRAM frame: type (1) + length varint (≤ 2 for these sizes).
        let byFrame = frameLimit - 3
        // Short header: 1 + DCID + packet number (≤ 4) + AEAD tag (16).
        let dcidLength = ngtcp2_conn_get_dcid(conn)?.pointee.datalen ?? Int(NGTCP2_MAX_CIDLEN)
        let byPacket = packetSizeFallback.limit(ngtcp2_conn_get_path_max_tx_udp_payload_size(conn)) - (1 + dcidLength + 4 + 16) - 3
        return max(0, min(byFrame, byPacket))
    }

    /// Queues an unreliable datagram (RFC 9221). It is sent when congestion control allows,
    /// before stream data; if ``QUICConfiguration/maxQueuedOutgoingDatagrams`` are already
    /// waiting, the oldest is dropped. Datagrams are never retransmitted.
    /// - Throws: ``QUICEngineError/Code/datagramRejected`` if the peer does not accept
    ///   datagrams or the payload exceeds ``maxDatagramPayloadSize``.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_writev_datagram`.
    public func sendDatagram(_ payload: [UInt8]) throws(QUICEngineError) {
        guard !isClosed else { throw QUICEngineError(.connectionClosed, "connection is closed") }
        guard let limit = maxDatagramPayloadSize else {
            throw QUICEngineError(.datagramRejected, "peer does not accept datagrams (yet)")
        }
        guard payload.count <= limit else {
            throw QUICEngineError(.datagramRejected, "datagram of \(payload.count) bytes exceeds \(limit)")
        }
        if outgoingDatagrams.count - outgoingDatagramHead >= configuration.maxQueuedOutgoingDatagrams {
            popOutgoingDatagram()
            counters.datagramsDroppedOut += 1
        }
        outgoingDatagrams.append(payload)
    }

    /// Outgoing datagrams waiting to be sent.
    public var queuedOutgoingDatagrams: Int { outgoingDatagrams.count - outgoingDatagramHead }

    private func popOutgoingDatagram() {
        guard outgoingDatagramHead < outgoingDatagrams.count else { return }
        outgoingDatagrams[outgoingDatagramHead] = []
        outgoingDatagramHead += 1
        if outgoingDatagramHead == outgoingDatagrams.count {
            outgoingDatagrams.removeAll(keepingCapacity: true)
            outgoingDatagramHead = 0
        }
    }

    // MARK: - Paths and connection IDs

    /// The path packets are currently sent on (ngtcp2's `ngtcp2_conn_get_path`).
    public var path: QUICPath { currentPath }

    /// Moves the client to a new local address at once (e.g. a new socket or interface);
    /// ngtcp2 validates the path in the background.
    ///
    /// Needs a spare connection ID from the server, which it issues after the handshake.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_initiate_immediate_migration`.
    public func migrate(toLocalAddress local: QUICSocketAddress, now: QUICTime) throws(QUICEngineError) {
        guard !isServer else { throw QUICEngineError(.wrongRole, "only a client can migrate") }
        guard let conn, !isClosed else { throw QUICEngineError(.connectionClosed, "connection is closed") }
        let newPath = QUICPath(local: local, remote: currentPath.remote)
        let rv = newPath.withNGTCP2Path { ngtcp2_conn_initiate_immediate_migration(conn, $0, now.nanoseconds) }
        guard rv == 0 else {
            throw QUICEngineError(.pathError, "ngtcp2_conn_initiate_immediate_migration: \(String(cString: ngtcp2_strerror(rv)))",
                                  libraryErrorCode: rv)
        }
        afterLibraryCall(now: now)
    }

    /// Starts a 1-RTT key update (RFC 9001 §6): packets sent from now on use the next keys, and
    /// the peer follows. ngtcp2 updates keys by itself before a key's confidentiality limit; this
    /// is for tests and for endpoints that want to rotate sooner. Refused before the handshake
    /// is confirmed or while the previous update is not yet acknowledged.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_initiate_key_update`.
    public func initiateKeyUpdate(now: QUICTime) throws(QUICEngineError) {
        guard let conn, !isClosed else { throw QUICEngineError(.connectionClosed, "connection is closed") }
        let rv = ngtcp2_conn_initiate_key_update(conn, now.nanoseconds)
        guard rv == 0 else { throw .library("ngtcp2_conn_initiate_key_update", rv) }
        afterLibraryCall(now: now)
    }

    /// The connection IDs peers may currently use to reach this endpoint (`ngtcp2_conn_get_scid`).
    /// A server driver routes datagrams whose destination CID is in this set here.
    public var sourceConnectionIDs: [QUICConnectionID] {
        guard let conn else { return [] }
        let n = ngtcp2_conn_get_num_scid(conn)
        var cids = [ngtcp2_cid](repeating: ngtcp2_cid(), count: n)
        let got = ngtcp2_conn_get_scid(conn, &cids)
        return cids.prefix(got).map(QUICConnectionID.init)
    }

    // MARK: - Closing

    /// Closes the connection with an application error code and reason phrase
    /// (CONNECTION_CLOSE type 0x1d). The frame goes out on the next ``pollTransmit(now:)``;
    /// the connection then stays in the closing period for three PTOs.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_write_connection_close`.
    public func close(errorCode: UInt64, reason: String = "", now: QUICTime) {
        guard case .open = state, pendingClose == nil else { return }
        guard conn != nil else { state = .terminated; return }
        let reasonBytes = Array(reason.utf8.prefix(1024))
        pendingClose = (NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_APPLICATION.rawValue, errorCode, reasonBytes)
        reportClose(QUICCloseReason(kind: .application, code: errorCode, reason: reason, initiatedByPeer: false))
    }

    /// Closes the connection when a client's early data outgrows
    /// ``QUICConfiguration/maxEarlyStreamData`` (FLOW_CONTROL_ERROR, RFC 9000 §4.1: the
    /// peer sent more than it may).
    private func refuseEarlyData() {
        guard case .open = state, pendingClose == nil else { return }
        let reason = "early data beyond \(configuration.maxEarlyStreamData) bytes"
        pendingClose = (NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_TRANSPORT.rawValue, UInt64(NGTCP2_FLOW_CONTROL_ERROR), Array(reason.utf8))
        reportClose(QUICCloseReason(kind: .transport, code: UInt64(NGTCP2_FLOW_CONTROL_ERROR), reason: reason, initiatedByPeer: false))
    }

    private func failConnection(libraryError rv: Int32, now: QUICTime) {
        guard let conn, case .open = state, pendingClose == nil else { return }
        var ccerr = ngtcp2_connection_close_error()
        if rv == NGTCP2_ERR_CRYPTO {
            ngtcp2_connection_close_error_set_transport_error_tls_alert(&ccerr, ngtcp2_conn_get_tls_alert(conn), nil, 0)
        } else {
            ngtcp2_connection_close_error_set_transport_error_liberr(&ccerr, rv, nil, 0)
        }
        // A peer's violation is named on the wire too, so its side can tell what it did.
        let explanation = QUICEngineError.peerViolationReason(rv)
        let message = explanation ?? String(cString: ngtcp2_strerror(rv))
        pendingClose = (ccerr.type.rawValue, ccerr.error_code, explanation.map { Array($0.utf8) } ?? [])
        reportClose(QUICCloseReason(kind: .transport, code: ccerr.error_code, reason: message, initiatedByPeer: false))
    }

    private func enterDraining(now: QUICTime) {
        guard let conn else { return }
        let pto = ngtcp2_conn_get_pto(conn)
        state = .draining(deadline: now.advanced(by: .nanoseconds(Int64(clamping: 3 * pto))))
        if statelessResetReceived {
            reportClose(QUICCloseReason(kind: .statelessReset, code: 0, reason: "stateless reset", initiatedByPeer: true))
            return
        }
        var ccerr = ngtcp2_connection_close_error()
        ngtcp2_conn_get_connection_close_error(conn, &ccerr)
        let reason = ccerr.reason.map { String(decoding: UnsafeBufferPointer(start: $0, count: ccerr.reasonlen), as: UTF8.self) } ?? ""
        let kind: QUICCloseReason.Kind
        switch ccerr.type {
        case NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_APPLICATION: kind = .application
        case NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_TRANSPORT_IDLE_CLOSE: kind = .idleTimeout
        default: kind = .transport
        }
        reportClose(QUICCloseReason(kind: kind, code: ccerr.error_code, reason: reason, initiatedByPeer: true))
    }

    private func terminate(_ reason: QUICCloseReason) {
        state = .terminated
        pendingClose = nil
        reportClose(reason)
    }

    func reportClose(_ reason: QUICCloseReason) {
        guard !closeReported else { return }
        closeReported = true
        recordEvent(.connectionClosed(reason))
    }

    // MARK: - Statistics

    /// Current path and congestion statistics.
    /// The corresponding ngtcp2 function is `ngtcp2_conn_get_conn_stat`.
    public var stats: QUICConnectionStats {
        let s = conn.map(Self.statistics) ?? ngtcp2_conn_stat()
        return QUICConnectionStats(
            smoothedRTT: .nanoseconds(Int64(clamping: s.smoothed_rtt)),
            rttVariance: .nanoseconds(Int64(clamping: s.rttvar)),
            minRTT: .nanoseconds(Int64(clamping: s.min_rtt == UInt64.max ? 0 : s.min_rtt)),
            latestRTT: .nanoseconds(Int64(clamping: s.latest_rtt)),
            congestionWindow: s.cwnd, slowStartThreshold: s.ssthresh, bytesInFlight: s.bytes_in_flight,
            deliveryRate: s.delivery_rate_sec, pacingRate: s.pacing_rate,
            maxUDPPayloadSize: packetSizeFallback.limit(s.max_tx_udp_payload_size), ptoCount: s.pto_count,
            packetsSent: counters.packetsSent, packetsReceived: counters.packetsReceived,
            bytesSent: counters.bytesSent, bytesReceived: counters.bytesReceived,
            streamBytesUnacknowledged: streams.values.reduce(0) { $0 + UInt64($1.send?.bufferedBytes ?? 0) },
            streamPacketsLost: streamPacketsLost, datagramsLost: counters.datagramsLost,
            datagramsDroppedOutgoing: counters.datagramsDroppedOut, datagramsDroppedIncoming: counters.datagramsDroppedIn)
    }

    /// Packets carrying stream data declared lost, over every stream this connection had.
    private var streamPacketsLost: UInt64 {
        streams.values.reduce(counters.closedStreamLoss) { $0 + $1.lossCount }
    }

    /// The smoothed RTT in nanoseconds once the handshake is complete and the path has an RTT
    /// sample; nil before. Cheaper than ``stats`` (no stream totals), for a driver asking often.
    public var measuredRoundTrip: Int64? {
        guard handshakeReported, let conn else { return nil }
        let s = Self.statistics(conn)
        guard s.min_rtt != UInt64.max, s.smoothed_rtt > 0 else { return nil }
        return Int64(clamping: s.smoothed_rtt)
    }

    // MARK: - After each ngtcp2 call

    /// Applies what callbacks recorded but could not do inside ngtcp2.
    private func afterLibraryCall(now: QUICTime) {
        guard let conn, case .open = state else { return }
        wakeWaitingWriters()
        if pendingConnectionCredit > 0 {
            ngtcp2_conn_extend_max_offset(conn, pendingConnectionCredit)
            pendingConnectionCredit = 0
        }
        if pendingRemoteBidiCredit > 0 {
            ngtcp2_conn_extend_max_streams_bidi(conn, pendingRemoteBidiCredit)
            pendingRemoteBidiCredit = 0
        }
        if pendingRemoteUniCredit > 0 {
            ngtcp2_conn_extend_max_streams_uni(conn, pendingRemoteUniCredit)
            pendingRemoteUniCredit = 0
        }
        if !handshakeReported && (handshakeCompletedFlag || takesEarlyDataAtOnce) {
            guard settleResumption(conn) else {
                handshakeCompletedFlag = false  // closing: the handshake is never reported
                return
            }
            handshakeReported = true
            stopKeepAliveIfPeerIdlesSooner(conn)
            let alpn = tls?.selectedALPN
            negotiatedALPN = alpn
            peerCertificate = verifiedPeerCertificate
            if let alpn, configuration.applicationProtocols.contains(alpn) {
                recordEvent(.handshakeCompleted(alpn: alpn))
            } else {
                // RFC 9001 §8.1: no_application_protocol alert (120) as CRYPTO_ERROR.
                pendingClose = (NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_TRANSPORT.rawValue, 0x100 + 120, [])
                reportClose(QUICCloseReason(kind: .transport, code: 0x178, reason: "no application protocol",
                                            initiatedByPeer: false))
            }
        }
        deliverSessionTickets()
        if let p = ngtcp2_conn_get_path(conn), let path = QUICPath(p.pointee), path != currentPath {
            currentPath = path
            recordEvent(.pathChanged(path))
        }
        var lossCounted = false
        for s in streams.values where (s.send?.bufferedBytes ?? 0) > 0 {
            let count = UInt64(ngtcp2_conn_get_stream_loss_count(conn, s.id.rawValue))
            if count != s.lossCount { lossCounted = true }
            s.lossCount = count
        }
        if lossCounted { noteHeavyLoss(conn) }
    }

    /// Sets ``heavyLossSeen`` once more than 2 % of 64 packets or more were lost with no queue
    /// on the path: counted from the last time the smoothed RTT (acknowledgement delays taken
    /// out) showed one, standing more than the unqueued excess and a sixteenth of the minimum
    /// above the minimum. A shallow queue's drops, which start-up's overshoot makes on a thin
    /// link, come with its delay and never count: there BBR v2's answer to loss is what keeps
    /// the queue (the latest RTT, acknowledgement delays included, showed a queue at nearly
    /// every loss on an emulated path with none).
    private func noteHeavyLoss(_ conn: OpaquePointer) {
        guard !heavyLossSeen, configuration.maxInFlightBandwidthDelayProducts != nil else { return }
        let lost = streamPacketsLost
        let s = Self.statistics(conn)
        let queued = s.min_rtt == UInt64.max || s.smoothed_rtt > s.min_rtt + unqueuedRTTExcess + s.min_rtt / 16
        guard !queued else {
            lossCountedSince = (counters.packetsSent, lost)
            return
        }
        let sent = counters.packetsSent - lossCountedSince.sent
        heavyLossSeen = sent >= 64 && lost > lossCountedSince.lost + sent / 50
    }

    // MARK: - Callback recording (called only from ngtcp2 callbacks)

    func recordEvent(_ event: QUICEvent) { events.append(event) }

    func verifyPeerCertificate(_ leaf: [UInt8]?) -> Bool {
        guard let leaf else {
            // A server must present a certificate; a client may omit one unless required.
            return isServer && configuration.clientAuthentication != .required
        }
        verifiedPeerCertificate = leaf
        return configuration.verifyPeer(leaf)
    }

    fileprivate func onHandshakeCompleted() -> Int32 {
        handshakeCompletedFlag = true
        return noteEarlyDataOutcome()
    }

    fileprivate func onStreamOpen(_ id: Int64) {
        let sid = QUICStreamID(rawValue: id)
        let canSend = sid.isBidirectional
        streams[id] = StreamState(id: sid, canSend: canSend, canReceive: true, blocks: sendBlocks)
        recordEvent(.streamOpened(sid))
    }

    fileprivate func onStreamData(_ id: Int64, fin: Bool, data: UnsafeRawBufferPointer) {
        let s: StreamState
        if let existing = streams[id] {
            s = existing
        } else {
            // Data on a stream ngtcp2 did not announce (should not happen): track it anyway.
            let sid = QUICStreamID(rawValue: id)
            s = StreamState(id: sid, canSend: sid.isBidirectional, canReceive: true, blocks: sendBlocks)
            streams[id] = s
        }
        guard !s.receiveDone else {
            pendingConnectionCredit += UInt64(data.count)
            return
        }
        if !handshakeCompletedFlag {
            earlyStreamBytes += UInt64(data.count)
            if earlyStreamBytes > configuration.maxEarlyStreamData { refuseEarlyData() }
        }
        if pendingClose != nil { return }  // closing: nothing more reaches the application
        let wasEmpty = s.receive.isEmpty
        if data.count > 0 { s.receive.append(data) }
        if wasEmpty && data.count > 0 { recordEvent(.streamReadable(s.id)) }
        if fin && !s.finReceived {
            s.finReceived = true
            recordEvent(.streamFinished(s.id))
        }
    }

    fileprivate func onAcked(_ id: Int64, upTo offset: UInt64) {
        streams[id]?.send?.acknowledge(upTo: offset)  // a waiting writer is woken after the call
    }

    /// Emits ``QUICEvent/streamWritable(_:)`` for each writer that was cut short once a quarter
    /// of its limit is free (or any of it, once nothing is left unsent): enough to be worth a
    /// write, early enough that the bytes still unsent cover the time the writer takes to
    /// answer. Checked after every ngtcp2 call, not only when acknowledgements move a stream's
    /// acknowledged prefix: the limit also grows without that. Behind a lost packet the prefix
    /// stays put for a round trip or more while what is in flight drains, and the limit counts
    /// the bytes the hole pins; woken only when the prefix moved, a writer sat idle until the
    /// retransmission was acknowledged, the path emptied, and the first flight after it, all
    /// sent before any acknowledgement came back, gave ngtcp2 0.12's rate sampler a rate sample
    /// of the pacing rate rather than the link's (docs/benchmarks.md, "Writers woken only when
    /// the acknowledged prefix moved").
    private func wakeWaitingWriters() {
        for id in writersWaiting {
            guard let s = streams[id], s.wantsWritable, !s.sendClosed, let send = s.send else {
                writersWaiting.remove(id)
                continue
            }
            let limit = sendBufferLimit(for: s)
            // Or any room at all once everything written was sent: behind a hole the peer's
            // credit can leave less than a quarter, and a writer kept waiting for a quarter
            // left the path idle while the credit it had went unused.
            if send.bufferedBytes <= limit - limit / 4 || (send.unsentBytes == 0 && send.bufferedBytes < limit) {
                s.wantsWritable = false
                writersWaiting.remove(id)
                recordEvent(.streamWritable(s.id))
            }
        }
    }

    fileprivate func onStreamClose(_ id: Int64, errorCode: UInt64?) {
        let sid = QUICStreamID(rawValue: id)
        if !isLocalStream(sid) {
            // Let the peer open a replacement (ngtcp2 does not do it for announced streams).
            if sid.isBidirectional { pendingRemoteBidiCredit += 1 } else { pendingRemoteUniCredit += 1 }
        }
        guard let s = streams[id] else { return }
        s.closed = true
        s.sendClosed = true
        sendQueueMembers.remove(id)
        recordEvent(.streamClosed(sid, errorCode: errorCode))
        forgetIfDone(s)
    }

    fileprivate func onStreamReset(_ id: Int64, errorCode: UInt64) {
        guard let s = streams[id] else { return }
        pendingConnectionCredit += UInt64(s.receive.count)
        s.receive.removeAll()
        s.receiveDone = true
        recordEvent(.streamReset(s.id, errorCode: errorCode))
    }


    fileprivate func onExtendMaxStreamData(_ id: Int64) {
        guard let s = streams[id], s.flowBlocked else { return }
        s.flowBlocked = false
        enqueueForSending(s)
    }

    fileprivate func onDatagram(_ data: UnsafeRawBufferPointer) {
        guard queuedIncomingDatagrams < configuration.maxQueuedIncomingDatagrams else {
            counters.datagramsDroppedIn += 1
            return
        }
        queuedIncomingDatagrams += 1
        recordEvent(.datagramReceived(Array(data)))
    }

    fileprivate func onDatagramLost() { counters.datagramsLost += 1 }
    fileprivate func onStatelessReset() { statelessResetReceived = true }

    private func isLocalStream(_ id: QUICStreamID) -> Bool { id.isClientInitiated != isServer }

    fileprivate func newConnectionID(_ cid: UnsafeMutablePointer<ngtcp2_cid>, token: UnsafeMutablePointer<UInt8>,
                                     length: Int) {
        // ngtcp2 asks for the length of the first source connection ID, the configured one.
        let bytes = length == configuration.connectionIDLength ? QUICRandom.connectionID(configuration) : QUICRandom.bytes(length)
        cid.pointee = QUICConnectionID(bytes)!.ngtcp2CID
        let t = QUICStatelessReset.token(secret: configuration.statelessResetSecret, connectionID: QUICConnectionID(bytes)!)
        for i in 0..<t.count { token[i] = t[i] }
        recordEvent(.connectionIDIssued(QUICConnectionID(bytes)!, statelessResetToken: t))
    }

    // MARK: - Callback table

    /// ngtcp2 callbacks as capture-free C thunks; user_data is the unretained connection.
    private static func makeCallbacks(isServer: Bool, packetProtection: QUICPacketProtection) -> ngtcp2_callbacks {
        var cb = ngtcp2_callbacks()
        cngtcp2_callbacks_set_crypto(&cb, isServer ? 1 : 0)
        if let backend = packetProtection.backend {
            cngtcp2_packet_protection_set_callbacks(backend, &cb, isServer ? 1 : 0)
        }
        cb.handshake_completed = { _, userData in
            connection(userData).onHandshakeCompleted()
        }
        cb.recv_stream_data = { _, flags, streamID, _, data, length, userData, _ in
            let bytes = UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : length)
            withConnection(userData) { $0.onStreamData(streamID, fin: flags & UInt32(NGTCP2_STREAM_DATA_FLAG_FIN) != 0, data: bytes) }
            return 0
        }
        cb.acked_stream_data_offset = { _, streamID, offset, length, userData, _ in
            withConnection(userData) { $0.onAcked(streamID, upTo: offset + length) }
            return 0
        }
        cb.stream_open = { _, streamID, userData in
            connection(userData).onStreamOpen(streamID)
            return 0
        }
        cb.stream_close = { _, flags, streamID, code, userData, _ in
            let hasCode = flags & UInt32(NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET) != 0
            connection(userData).onStreamClose(streamID, errorCode: hasCode ? code : nil)
            return 0
        }
        cb.stream_reset = { _, streamID, _, code, userData, _ in
            connection(userData).onStreamReset(streamID, errorCode: code)
            return 0
        }
        cb.extend_max_stream_data = { _, streamID, _, userData, _ in
            connection(userData).onExtendMaxStreamData(streamID)
            return 0
        }
        cb.extend_max_local_streams_bidi = { _, _, userData in
            connection(userData).recordEvent(.streamsAvailable(bidirectional: true))
            return 0
        }
        cb.extend_max_local_streams_uni = { _, _, userData in
            connection(userData).recordEvent(.streamsAvailable(bidirectional: false))
            return 0
        }
        cb.recv_stateless_reset = { _, _, userData in
            connection(userData).onStatelessReset()
            return 0
        }
        cb.rand = { dest, length, _ in
            if let dest, length > 0 { QUICRandom.fill(dest, length) }
        }
        cb.get_new_connection_id = { _, cid, token, length, userData in
            guard let cid, let token else { return NGTCP2_ERR_CALLBACK_FAILURE }
            connection(userData).newConnectionID(cid, token: token, length: length)
            return 0
        }
        cb.remove_connection_id = { _, cid, userData in
            if let cid { connection(userData).recordEvent(.connectionIDRetired(QUICConnectionID(cid.pointee))) }
            return 0
        }
        cb.path_validation = { _, _, path, result, userData in
            if let path, let p = QUICPath(path.pointee) {
                connection(userData).recordEvent(.pathValidated(p, succeeded: result == NGTCP2_PATH_VALIDATION_RESULT_SUCCESS))
            }
            return 0
        }
        cb.recv_datagram = { _, _, data, length, userData in
            connection(userData).onDatagram(UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : length))
            return 0
        }
        cb.lost_datagram = { _, _, userData in
            connection(userData).onDatagramLost()
            return 0
        }
        return cb
    }
}

/// The connection behind an ngtcp2 callback's `user_data` (unretained: the connection owns the ngtcp2_conn).
private func connection(_ userData: UnsafeMutableRawPointer?) -> QUICConnection {
    Unmanaged<QUICConnection>.fromOpaque(userData!).takeUnretainedValue()
}

/// Runs `body` on the connection behind `user_data` without retaining and releasing it, for the
/// callbacks that come once per packet: they run inside an ngtcp2 call the connection made, which
/// keeps it alive.
private func withConnection(_ userData: UnsafeMutableRawPointer?, _ body: (QUICConnection) -> Void) {
    Unmanaged<QUICConnection>.fromOpaque(userData!)._withUnsafeGuaranteedRef(body)
}

/// ngtcp2_crypto asks the TLS session's conn_ref for the ngtcp2_conn.
private let getConnThunk: @convention(c) (UnsafeMutablePointer<ngtcp2_crypto_conn_ref>?) -> OpaquePointer? = { ref in
    guard let userData = ref?.pointee.user_data else { return nil }
    return Unmanaged<QUICConnection>.fromOpaque(userData).takeUnretainedValue().conn
}
