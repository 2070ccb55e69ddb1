internal import CNGTCP2

/// Session resumption and 0-RTT (RFC 9001 §4.6) around the handshake of a ``QUICConnection``.
///
/// Kept apart from the connection's packet paths: these run once per connection, at its
/// creation, when the handshake completes, and when a ticket arrives.
extension QUICConnection {
    /// Whether early data was attempted and what the server did with it; on a server,
    /// ``QUICEarlyData/accepted`` once it took a client's early data, else ``QUICEarlyData/notAttempted``.
    public var earlyData: QUICEarlyData { tls?.earlyData ?? .notAttempted }

    /// Whether the completed handshake resumed an earlier session; false until it completes.
    public var isResumed: Bool { isHandshakeComplete && tls?.isResumed == true }

    /// Server: the client resumed, its early data was taken and the issuer's register makes
    /// that data single-use (``QUICSessionTicketIssuer/register``): the handshake is reported
    /// now, before the client's Finished, so the application reads the early data at once and
    /// answers in 0.5-RTT packets. The resumed client's certificate is checked first, as at
    /// completion (``settleResumption(_:)``). Not while closing: a refused certificate is final.
    var takesEarlyDataAtOnce: Bool {
        guard isServer, pendingClose == nil, configuration.sessionTickets?.register != nil, let tls else { return false }
        return tls.earlyDataAccepted && tls.isResumed
    }

    /// Client: when the offered ticket carries the server's transport parameters, lets streams
    /// open and send before the handshake completes, within those limits
    /// (`ngtcp2_conn_set_early_remote_transport_params`). Unreadable parameters leave the
    /// resumption without early data.
    func prepareEarlyData(_ conn: OpaquePointer) {
        guard let tls, tls.offeredSession, let ticket = configuration.resumption,
              ticket.transportParameters.count <= QUICSessionTicket.maximumPartLength else { return }
        var params = ngtcp2_transport_params()
        let rv = ticket.transportParameters.withUnsafeBufferPointer {
            ngtcp2_decode_transport_params_versioned(
                NGTCP2_TRANSPORT_PARAMS_VERSION, &params, NGTCP2_TRANSPORT_PARAMS_TYPE_ENCRYPTED_EXTENSIONS, $0.baseAddress, $0.count)
        }
        guard rv == 0 else { return }
        ngtcp2_conn_set_early_remote_transport_params_versioned(conn, NGTCP2_TRANSPORT_PARAMS_VERSION, &params)
        tls.earlyData = .attempted
    }

    /// Client, inside ngtcp2's `handshake_completed`: GnuTLS tells only now whether the server
    /// took the early data; if not, ngtcp2 must forget the 0-RTT streams before it goes on
    /// (`ngtcp2_conn_early_data_rejected`), and ``settleResumption(_:)`` sends them again.
    func noteEarlyDataOutcome() -> Int32 {
        guard let tls, tls.earlyData == .attempted, let conn else { return 0 }
        if tls.earlyDataAccepted {
            tls.earlyData = .accepted
            return 0
        }
        tls.earlyData = .rejected
        return ngtcp2_conn_early_data_rejected(conn) == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE
    }

    /// When the handshake completes, before it is reported: resend refused early data, and give a resumed session's peer certificate, which the handshake did
    /// not carry, to the verifier as a full handshake would. False when the connection failed:
    /// it is closing and never reports the handshake complete, so nothing reads its early data.
    func settleResumption(_ conn: OpaquePointer) -> Bool {
        guard let tls else { return true }
        if isServer && tls.earlyDataAccepted { tls.earlyData = .accepted }
        if tls.earlyData == .rejected && !resendRefusedEarlyData(conn) {
            return fail(code: UInt64(NGTCP2_INTERNAL_ERROR), "cannot resend the refused early data")
        }
        // RFC 8446 bad_certificate (42) as CRYPTO_ERROR, as a refusal in a full handshake ends.
        if tls.isResumed && !verifyPeerCertificate(TLSSession.peerLeafCertificate(tls.session)) {
            return fail(code: 0x100 + 42, "the resumed peer's certificate was refused")
        }
        return true
    }

    private func fail(code: UInt64, _ reason: String) -> Bool {
        pendingClose = (NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_TRANSPORT.rawValue, code, [])
        reportClose(QUICCloseReason(kind: .transport, code: code, reason: reason, initiatedByPeer: false))
        return false
    }

    /// Reopens the streams written as refused early data under the same IDs (ngtcp2 numbers them
    /// again from the start) and queues their bytes again from offset 0: the application sees
    /// one stream, delivered once, in 1-RTT packets.
    private func resendRefusedEarlyData(_ conn: OpaquePointer) -> Bool {
        let ours = streams.values.filter { $0.id.rawValue & 1 == (isServer ? 1 : 0) }.sorted { $0.id.rawValue < $1.id.rawValue }
        for s in ours {
            var id: Int64 = -1
            let rv = s.id.isBidirectional ? ngtcp2_conn_open_bidi_stream(conn, &id, nil) : ngtcp2_conn_open_uni_stream(conn, &id, nil)
            guard rv == 0, id == s.id.rawValue, s.send?.rewind() ?? true else { return false }
            s.finSent = false
            s.flowBlocked = false
            enqueueForSending(s)
        }
        return true
    }

    /// Client, from GnuTLS's NewSessionTicket hook: keep the first session for ``deliverSessionTickets()``.
    func onSessionTicket(_ session: [UInt8]) {
        guard let tls, configuration.sessionTicketReceiver != nil, !tls.sessionDelivered, tls.receivedSession == nil,
              session.count <= QUICSessionTicket.maximumPartLength else { return }
        tls.receivedSession = session
    }

    /// Hands the connection's first ticket to ``QUICConfiguration/sessionTicketReceiver`` once,
    /// with the server's transport parameters of this connection.
    func deliverSessionTickets() {
        guard let tls, let session = tls.receivedSession, let receiver = configuration.sessionTicketReceiver, let conn,
              let remote = ngtcp2_conn_get_remote_transport_params(conn) else { return }
        tls.receivedSession = nil
        tls.sessionDelivered = true
        var encoded = [UInt8](repeating: 0, count: 1024)
        let n = encoded.withUnsafeMutableBufferPointer {
            ngtcp2_encode_transport_params_versioned(
                $0.baseAddress, $0.count, NGTCP2_TRANSPORT_PARAMS_TYPE_ENCRYPTED_EXTENSIONS, NGTCP2_TRANSPORT_PARAMS_VERSION, remote)
        }
        guard n > 0 else { return }
        receiver(QUICSessionTicket(tlsSession: session, transportParameters: Array(encoded.prefix(Int(n)))))
    }
}
