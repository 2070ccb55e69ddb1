internal import CNGTCP2

/// Owns the GnuTLS session and credentials of one connection.
///
/// ngtcp2_crypto_gnutls drives the handshake through the session; this class only
/// configures it (TLS 1.3 only, ALPN, certificate, client-certificate policy, the
/// peer verification hook) and frees it. The session's user pointer is the
/// connection's `ngtcp2_crypto_conn_ref`, as ngtcp2_crypto requires.
final class TLSSession {
    let session: gnutls_session_t
    private let credentials: gnutls_certificate_credentials_t
    private let alpnStorage: [[UInt8]]
    /// The server's ticket key and replay filter, kept alive while GnuTLS points at them.
    private let ticketIssuer: QUICSessionTicketIssuer?
    /// Whether this client offered a stored session (``QUICConfiguration/resumption``).
    let offeredSession: Bool
    /// Client: what became of early data (set by the connection's resumption steps).
    var earlyData: QUICEarlyData = .notAttempted
    /// Client: session data from the first NewSessionTicket, until it is handed to the application.
    var receivedSession: [UInt8]?
    /// Client: a ticket was handed to the application; later ones (GnuTLS servers send two, for
    /// parallel connections) are ignored, as one per host is kept.
    var sessionDelivered = false

    /// TLS 1.3 only, AEADs QUIC allows, ECDHE groups; no middlebox compatibility mode (RFC 9001 §8.4).
    private static let priority =
        "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305:"
        + "-GROUP-ALL:+GROUP-X25519:+GROUP-SECP256R1:+GROUP-SECP384R1:%DISABLE_TLS13_COMPAT_MODE"

    init(isServer: Bool, configuration: QUICConfiguration,
         connRef: UnsafeMutablePointer<ngtcp2_crypto_conn_ref>) throws(QUICEngineError) {
        var cred: gnutls_certificate_credentials_t?
        var rv = gnutls_certificate_allocate_credentials(&cred)
        guard rv == 0, let cred else { throw .gnutls("gnutls_certificate_allocate_credentials", rv) }

        rv = Self.setKey(cred, certificatePEM: configuration.certificateChainPEM, keyPEM: configuration.privateKeyPEM)
        if rv < 0 {
            gnutls_certificate_free_credentials(cred)
            throw QUICEngineError(.invalidConfiguration,
                                  "certificate or key PEM rejected: \(String(cString: gnutls_strerror(rv)))")
        }

        var session: gnutls_session_t?
        // QUIC carries no EndOfEarlyData message (RFC 9001 §8.3).
        let early = isServer ? configuration.sessionTickets != nil : configuration.resumption != nil
        let flags = UInt32(isServer ? GNUTLS_SERVER : GNUTLS_CLIENT)
            | (early ? GNUTLS_ENABLE_EARLY_DATA.rawValue | GNUTLS_NO_END_OF_EARLY_DATA.rawValue : 0)
        rv = gnutls_init(&session, flags)
        guard rv == 0, let session else {
            gnutls_certificate_free_credentials(cred)
            throw .gnutls("gnutls_init", rv)
        }
        self.session = session
        self.credentials = cred
        self.alpnStorage = configuration.applicationProtocols.map { Array($0.utf8) }
        self.ticketIssuer = isServer ? configuration.sessionTickets : nil
        self.offeredSession = !isServer && configuration.resumption != nil

        // From here on deinit frees session and credentials.
        let configured = isServer
            ? ngtcp2_crypto_gnutls_configure_server_session(session)
            : ngtcp2_crypto_gnutls_configure_client_session(session)
        if configured != 0 {
            throw QUICEngineError(.tlsSetupFailed, "ngtcp2_crypto_gnutls_configure_\(isServer ? "server" : "client")_session failed")
        }
        if let backend = configuration.packetProtection.backend,
           cngtcp2_packet_protection_configure_session(backend, session) != 0 {
            throw QUICEngineError(.tlsSetupFailed, "the packet protection backend refused the TLS session")
        }
        rv = gnutls_priority_set_direct(session, Self.priority, nil)
        if rv != 0 { throw .gnutls("gnutls_priority_set_direct", rv) }
        rv = gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, UnsafeMutableRawPointer(cred))
        if rv != 0 { throw .gnutls("gnutls_credentials_set", rv) }

        gnutls_session_set_ptr(session, UnsafeMutableRawPointer(connRef))
        gnutls_session_set_verify_function(session, tlsVerifyThunk)

        if isServer {
            gnutls_certificate_server_set_request(session, gnutls_certificate_request_t(configuration.clientAuthentication.request))
            try enableTickets()
        } else {
            let name = Array(configuration.serverName.utf8)
            rv = name.withUnsafeBytes { gnutls_server_name_set(session, GNUTLS_NAME_DNS, $0.baseAddress, $0.count) }
            if rv != 0 { throw .gnutls("gnutls_server_name_set", rv) }
            try offer(configuration.resumption, collectTickets: configuration.sessionTicketReceiver != nil)
        }

        rv = alpnStorage.withDatums { datums in
            gnutls_alpn_set_protocols(session, datums.baseAddress, UInt32(datums.count),
                                      UInt32(GNUTLS_ALPN_MANDATORY.rawValue | (isServer ? GNUTLS_ALPN_SERVER_PRECEDENCE.rawValue : 0)))
        }
        if rv != 0 { throw .gnutls("gnutls_alpn_set_protocols", rv) }
    }

    deinit {
        gnutls_deinit(session)
        gnutls_certificate_free_credentials(credentials)
    }

    private static func setKey(_ cred: gnutls_certificate_credentials_t, certificatePEM: String, keyPEM: String) -> Int32 {
        var cert = Array(certificatePEM.utf8)
        var key = Array(keyPEM.utf8)
        return cert.withUnsafeMutableBufferPointer { c in
            key.withUnsafeMutableBufferPointer { k in
                var cd = gnutls_datum_t(data: c.baseAddress, size: UInt32(c.count))
                var kd = gnutls_datum_t(data: k.baseAddress, size: UInt32(k.count))
                return gnutls_certificate_set_x509_key_mem2(cred, &cd, &kd, GNUTLS_X509_FMT_PEM, nil, 0)
            }
        }
    }

    /// Server: seal tickets with the issuer's key (GnuTLS sends them when the handshake ends),
    /// filter replayed early data, and allow early data of any TLS size, as QUIC requires
    /// (RFC 9001 §4.6.1: flow control bounds it).
    private func enableTickets() throws(QUICEngineError) {
        guard let issuer = ticketIssuer else { return }
        var key = issuer.keyDatum
        let rv = gnutls_session_ticket_enable_server(session, &key)
        if rv != 0 { throw .gnutls("gnutls_session_ticket_enable_server", rv) }
        gnutls_anti_replay_enable(session, issuer.antiReplay)
        let limit = gnutls_record_set_max_early_data_size(session, 0xffff_ffff)
        if limit != 0 { throw .gnutls("gnutls_record_set_max_early_data_size", limit) }
    }

    /// Client: offer a stored session, and hear about the tickets the server sends.
    private func offer(_ ticket: QUICSessionTicket?, collectTickets: Bool) throws(QUICEngineError) {
        if collectTickets {
            gnutls_handshake_set_hook_function(session, UInt32(GNUTLS_HANDSHAKE_NEW_SESSION_TICKET.rawValue),
                                               Int32(GNUTLS_HOOK_POST), newSessionTicketHook)
        }
        guard let ticket else { return }
        let rv = ticket.tlsSession.withUnsafeBytes { gnutls_session_set_data(session, $0.baseAddress, $0.count) }
        // Damaged or foreign session data: say so; the caller drops the ticket and connects without it.
        if rv != 0 {
            throw QUICEngineError(.invalidConfiguration, "the stored session is unusable: \(String(cString: gnutls_strerror(rv)))")
        }
    }

    /// Whether the handshake resumed a session (`gnutls_session_is_resumed`).
    var isResumed: Bool { gnutls_session_is_resumed(session) != 0 }

    /// Whether the server accepted early data (`GNUTLS_SFLAGS_EARLY_DATA`); meaningful after the handshake.
    var earlyDataAccepted: Bool { gnutls_session_get_flags(session) & GNUTLS_SFLAGS_EARLY_DATA.rawValue != 0 }

    /// The session data to resume with (`gnutls_session_get_data2`), nil if GnuTLS has none.
    static func sessionData(_ session: gnutls_session_t) -> [UInt8]? {
        var datum = gnutls_datum_t()
        guard gnutls_session_get_data2(session, &datum) == 0, let data = datum.data else { return nil }
        defer { cngtcp2_gnutls_free(data) }
        return Array(UnsafeBufferPointer(start: data, count: Int(datum.size)))
    }

    /// The negotiated ALPN protocol (`gnutls_alpn_get_selected_protocol`), if any.
    var selectedALPN: String? {
        var datum = gnutls_datum_t()
        guard gnutls_alpn_get_selected_protocol(session, &datum) == 0, let data = datum.data else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(datum.size)), as: UTF8.self)
    }

    /// The peer's leaf certificate in DER (`gnutls_certificate_get_peers`), if it sent one.
    static func peerLeafCertificate(_ session: gnutls_session_t) -> [UInt8]? {
        var count: UInt32 = 0
        guard let list = gnutls_certificate_get_peers(session, &count), count > 0, let data = list[0].data else {
            return nil
        }
        return Array(UnsafeBufferPointer(start: data, count: Int(list[0].size)))
    }
}

extension Array where Element == [UInt8] {
    /// Calls `body` with `gnutls_datum_t`s pointing into these byte arrays.
    fileprivate func withDatums<R>(_ body: (UnsafeMutableBufferPointer<gnutls_datum_t>) -> R) -> R {
        var flat: [UInt8] = []
        var ranges: [Range<Int>] = []
        for item in self {
            ranges.append(flat.count..<flat.count + item.count)
            flat.append(contentsOf: item)
        }
        return flat.withUnsafeMutableBufferPointer { base in
            var datums = ranges.map {
                gnutls_datum_t(data: base.baseAddress! + $0.lowerBound, size: UInt32($0.count))
            }
            return datums.withUnsafeMutableBufferPointer { body($0) }
        }
    }
}

/// GnuTLS calls this when the peer's Certificate message arrives (`gnutls_session_set_verify_function`).
/// It only asks the connection's verifier; returning non-zero makes GnuTLS abort the
/// handshake with an alert, which ngtcp2 turns into a CRYPTO_ERROR close.
private let tlsVerifyThunk: @convention(c) (gnutls_session_t?) -> Int32 = { session in
    guard let session, let ptr = gnutls_session_get_ptr(session) else { return GNUTLS_E_CERTIFICATE_ERROR }
    let connRef = ptr.assumingMemoryBound(to: ngtcp2_crypto_conn_ref.self)
    guard let userData = connRef.pointee.user_data else { return GNUTLS_E_CERTIFICATE_ERROR }
    let connection = Unmanaged<QUICConnection>.fromOpaque(userData).takeUnretainedValue()
    return connection.verifyPeerCertificate(TLSSession.peerLeafCertificate(session)) ? 0 : GNUTLS_E_CERTIFICATE_ERROR
}

/// GnuTLS calls this after a NewSessionTicket arrives (`gnutls_handshake_set_hook_function`);
/// the connection keeps the session data and hands it out after the ngtcp2 call.
private let newSessionTicketHook: @convention(c) (gnutls_session_t?, UInt32, UInt32, UInt32, UnsafePointer<gnutls_datum_t>?)
    -> Int32 = { session, _, _, incoming, _ in
    guard incoming != 0, let session, let ptr = gnutls_session_get_ptr(session),
          let userData = ptr.assumingMemoryBound(to: ngtcp2_crypto_conn_ref.self).pointee.user_data,
          let data = TLSSession.sessionData(session) else { return 0 }
    Unmanaged<QUICConnection>.fromOpaque(userData).takeUnretainedValue().onSessionTicket(data)
    return 0
}
