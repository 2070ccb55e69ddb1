import QUICEngine
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity

/// One-line descriptions of QUIC close reasons and engine errors.
enum QUICErrors {
    /// `offered` names the application protocols in a "does not speak" refusal.
    static func describe(_ reason: QUICCloseReason, verifier: PeerVerifier, offered: [String]) -> QXferError {
        if let failure = verifier.result.failure { return failure }
        switch reason.kind {
        case .idleTimeout:
            return QXferError(.idleTimeout, "the connection was idle for too long (or the peer vanished) and was closed")
        case .handshakeTimeout:
            return QXferError(.connectFailed, "no QUIC answer from the peer (handshake timed out: nothing answers on that UDP port, or the path drops UDP or datagrams of 1200 bytes)")
        case .statelessReset:
            return QXferError(.connectionClosed, "the peer no longer knows this connection (stateless reset)")
        case .versionNegotiation:
            return QXferError(.handshakeFailed, "the peer does not support our QUIC version")
        case .application:
            if reason.code == 0 {
                return QXferError(.connectionClosed, "the peer closed the connection")
            }
            return QXferError(.connectionClosed, "the peer closed the connection (error \(reason.code)\(reason.reason.isEmpty ? "" : ": " + reason.reason))")
        default:
            if reason.isCryptoError {
                switch reason.code - QUICCloseReason.cryptoErrorBase {
                case 42, 43, 44, 45, 46, 48, 49:
                    return .peerRefusedCertificate
                case 116:
                    return .peerRequiresClientCertificate
                case 120:
                    return .noCommonApplicationProtocol(offered: offered)
                case 70:
                    return .peerLacksTLS13
                default:
                    return QXferError(.handshakeFailed, "the QUIC handshake failed (TLS alert \(reason.code - QUICCloseReason.cryptoErrorBase))")
                }
            }
            if reason.code == 0x178 || reason.reason == "no application protocol" {
                return .noCommonApplicationProtocol(offered: offered)
            }
            if reason.code == 0 && !reason.initiatedByPeer {
                return QXferError(.cancelled, "the connection was closed")
            }
            return QXferError(.connectionClosed, "the QUIC connection closed: \(reason)")
        }
    }

    static func describe(_ error: any Error) -> QXferError {
        if let error = error as? QXferError { return error }
        return QXferError(.connectionClosed, "QUIC: \(error)", underlying: error)
    }
}
