@_spi(Stacks) import QXferCore

/// The refusals a peer can send during a TLS 1.3 handshake, worded once for both stacks
/// (swift-nio-ssl's alerts on TCP, GnuTLS's crypto errors on QUIC).
extension QXferError {
    /// The peer refused this host's certificate (mutual TLS against its allow-list).
    @_spi(Stacks) public static var peerRefusedCertificate: QXferError {
        QXferError(.untrustedPeer, "the peer refused this host's certificate: it admits only the senders it lists or has paired with (recv --allow / --paired-only)")
    }

    /// The peer requires a client certificate and got none.
    @_spi(Stacks) public static var peerRequiresClientCertificate: QXferError {
        QXferError(.untrustedPeer, "the peer requires a client certificate")
    }

    /// The peer does not offer TLS 1.3.
    @_spi(Stacks) public static var peerLacksTLS13: QXferError {
        QXferError(.handshakeFailed, "the peer does not support TLS 1.3")
    }

    /// What came back is not TLS at all: another program listens on that port (a web
    /// server, sshd), or a proxy answered.
    @_spi(Stacks) public static var peerSpeaksNoTLS: QXferError {
        QXferError(.protocolMismatch, "the peer does not speak TLS: another program listens on that port (not a qxfer receiver)")
    }

    /// No application protocol in common: the peer speaks none of `offered` (ALPN).
    @_spi(Stacks) public static func noCommonApplicationProtocol(offered: [String]) -> QXferError {
        QXferError(.protocolMismatch, "the peer does not speak \(offered.joined(separator: " or "))")
    }
}

extension QXferError {
    /// The same error, keeping `error` as the lower-level cause for logs.
    @_spi(Stacks) public func caused(by error: any Error & Sendable) -> QXferError {
        QXferError(code, message, underlying: error)
    }
}
