internal import CNGTCP2

/// The version and connection IDs of any QUIC packet, read without decrypting it —
/// what a server driver needs to route a datagram (`ngtcp2_pkt_decode_version_cid`).
public struct QUICPacketHeader: Hashable, Sendable {
    /// The QUIC version of a long-header packet; 0 for short-header packets.
    public var version: UInt32
    /// The destination connection ID: the key to route on.
    public var destinationConnectionID: QUICConnectionID
    /// The source connection ID (long headers only; empty otherwise).
    public var sourceConnectionID: QUICConnectionID
    /// Whether the packet uses the long header (Initial, Handshake, 0-RTT, Retry).
    public var isLongHeader: Bool

    /// The outcome of ``decode(datagram:shortHeaderConnectionIDLength:)``.
    public enum Decoded: Hashable, Sendable {
        /// A packet of a version ngtcp2 supports.
        case supported(QUICPacketHeader)
        /// A long-header packet of an unsupported version: answer with
        /// ``QUICVersionNegotiation/write(for:)`` (if the datagram is at least 1200 bytes).
        case unsupportedVersion(QUICPacketHeader)
        /// Not a parseable QUIC packet: drop it.
        case invalid
    }

    /// Decodes version and connection IDs of the first packet in `datagram`.
    ///
    /// - Parameters:
    ///   - datagram: the UDP payload.
    ///   - shortHeaderConnectionIDLength: the length of the connection IDs this endpoint
    ///     issues (``QUICConfiguration/connectionIDLength``); short headers do not carry it.
    /// The corresponding ngtcp2 function is `ngtcp2_pkt_decode_version_cid`.
    public static func decode(datagram: [UInt8], shortHeaderConnectionIDLength: Int) -> Decoded {
        datagram.withUnsafeBytes { decode(datagram: $0, shortHeaderConnectionIDLength: shortHeaderConnectionIDLength) }
    }

    /// ``decode(datagram:shortHeaderConnectionIDLength:)`` in place, without copying the datagram
    /// (a listener decodes every datagram that reaches it, junk included).
    public static func decode(datagram: UnsafeRawBufferPointer, shortHeaderConnectionIDLength: Int) -> Decoded {
        guard !datagram.isEmpty else { return .invalid }
        var vc = ngtcp2_version_cid()
        let rv = ngtcp2_pkt_decode_version_cid(
            &vc, datagram.baseAddress!.assumingMemoryBound(to: UInt8.self), datagram.count, shortHeaderConnectionIDLength)
        let header = QUICPacketHeader(
            version: vc.version,
            destinationConnectionID: QUICConnectionID(pointer: vc.dcid, length: vc.dcidlen),
            sourceConnectionID: QUICConnectionID(pointer: vc.scid, length: vc.scidlen),
            isLongHeader: datagram[0] & 0x80 != 0)
        switch rv {
        case 0: return .supported(header)
        case NGTCP2_ERR_VERSION_NEGOTIATION: return .unsupportedVersion(header)
        default: return .invalid
        }
    }
}

/// A client's first Initial packet, accepted by a server (`ngtcp2_accept`).
public struct QUICInitialPacket: Hashable, Sendable {
    /// The QUIC version the client chose.
    public var version: UInt32
    /// The connection ID the client chose for the server (becomes `original_destination_connection_id`).
    public var destinationConnectionID: QUICConnectionID
    /// The client's own connection ID.
    public var sourceConnectionID: QUICConnectionID
    /// The address validation token, if the client sent one.
    public var token: [UInt8]

    /// An Initial's header fields as given (tests, tools); servers get theirs from ``accept(datagram:)``.
    public init(version: UInt32, destinationConnectionID: QUICConnectionID, sourceConnectionID: QUICConnectionID, token: [UInt8]) {
        self.version = version
        self.destinationConnectionID = destinationConnectionID
        self.sourceConnectionID = sourceConnectionID
        self.token = token
    }

    /// Checks whether `datagram` may start a new connection; nil if it must be dropped
    /// (not an Initial, too short, bad connection IDs).
    /// The corresponding ngtcp2 function is `ngtcp2_accept`.
    public static func accept(datagram: [UInt8]) -> QUICInitialPacket? {
        datagram.withUnsafeBytes { accept(datagram: $0) }
    }

    /// ``accept(datagram:)`` in place, without copying the datagram.
    public static func accept(datagram: UnsafeRawBufferPointer) -> QUICInitialPacket? {
        guard !datagram.isEmpty else { return nil }
        var hd = ngtcp2_pkt_hd()
        let rv = ngtcp2_accept(&hd, datagram.baseAddress!.assumingMemoryBound(to: UInt8.self), datagram.count)
        guard rv == 0 else { return nil }
        let token: [UInt8]
        if let base = hd.token.base, hd.token.len > 0 {
            token = Array(UnsafeBufferPointer(start: base, count: hd.token.len))
        } else {
            token = []
        }
        return QUICInitialPacket(version: hd.version, destinationConnectionID: QUICConnectionID(hd.dcid),
                                 sourceConnectionID: QUICConnectionID(hd.scid), token: token)
    }
}

/// Version Negotiation packets (RFC 9000 §17.2.1).
public enum QUICVersionNegotiation {
    /// The QUIC versions this engine speaks (v1 and v2 as ngtcp2 0.12 supports them).
    public static var supportedVersions: [UInt32] {
        [NGTCP2_PROTO_VER_V1, NGTCP2_PROTO_VER_V2_DRAFT].filter { ngtcp2_is_supported_version($0) != 0 }
    }

    /// Builds the Version Negotiation packet answering `header` (IDs swapped, our versions
    /// listed), or nil if it cannot be written.
    /// The corresponding ngtcp2 function is `ngtcp2_pkt_write_version_negotiation`.
    public static func write(for header: QUICPacketHeader) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 256)
        var random: UInt8 = 0
        QUICRandom.fill(&random, 1)
        let versions = supportedVersions
        let n = buffer.withUnsafeMutableBufferPointer { b in
            header.sourceConnectionID.bytes.withUnsafeBufferPointer { dcid in
                header.destinationConnectionID.bytes.withUnsafeBufferPointer { scid in
                    versions.withUnsafeBufferPointer { v in
                        ngtcp2_pkt_write_version_negotiation(b.baseAddress, b.count, random, dcid.baseAddress, dcid.count,
                                                             scid.baseAddress, scid.count, v.baseAddress, v.count)
                    }
                }
            }
        }
        guard n > 0 else { return nil }
        return Array(buffer.prefix(Int(n)))
    }
}

/// Stateless reset support (RFC 9000 §10.3).
public enum QUICStatelessReset {
    /// Length of a stateless reset token (`NGTCP2_STATELESS_RESET_TOKENLEN`).
    public static let tokenLength = Int(NGTCP2_STATELESS_RESET_TOKENLEN)

    /// Derives the token for a connection ID from a static secret (HKDF).
    /// The corresponding ngtcp2 function is `ngtcp2_crypto_generate_stateless_reset_token`.
    public static func token(secret: [UInt8], connectionID: QUICConnectionID) -> [UInt8] {
        var token = [UInt8](repeating: 0, count: tokenLength)
        var cid = connectionID.ngtcp2CID
        let rv = token.withUnsafeMutableBufferPointer { t in
            secret.withUnsafeBufferPointer { s in
                ngtcp2_crypto_generate_stateless_reset_token(t.baseAddress, s.baseAddress, s.count, &cid)
            }
        }
        precondition(rv == 0, "ngtcp2_crypto_generate_stateless_reset_token failed")
        return token
    }

    /// Builds a stateless reset packet carrying `token`, sized just below `triggeringPacketLength`
    /// so resets cannot loop (minimum 41 bytes); nil if the trigger is too short to answer.
    /// The corresponding ngtcp2 function is `ngtcp2_pkt_write_stateless_reset`.
    public static func write(token: [UInt8], triggeringPacketLength: Int) -> [UInt8]? {
        guard token.count == tokenLength else { return nil }
        // Smaller than the trigger (no reset loops), at least 41 bytes so it is indistinguishable
        // from a short-header packet with a 20-byte connection ID (RFC 9000 §10.3).
        let length = min(triggeringPacketLength - 1, 1200)
        guard length >= 41 else { return nil }
        let randomLength = length - tokenLength
        var random = QUICRandom.bytes(randomLength)
        var buffer = [UInt8](repeating: 0, count: length)
        let n = buffer.withUnsafeMutableBufferPointer { b in
            token.withUnsafeBufferPointer { t in
                random.withUnsafeMutableBufferPointer { r in
                    ngtcp2_pkt_write_stateless_reset(b.baseAddress, b.count, t.baseAddress, r.baseAddress, r.count)
                }
            }
        }
        guard n > 0 else { return nil }
        return Array(buffer.prefix(Int(n)))
    }
}

/// Address validation with Retry (RFC 9000 §8.1.2): before a server spends a connection's
/// state and handshake work on an Initial, it can ask the client to prove that it receives
/// packets at its source address by echoing a token. The token is sealed with a server secret
/// and binds the client's address, the connection ID the server chose and the client's
/// original destination connection ID, with a time stamp.
public enum QUICRetry {
    /// How long a Retry token stays valid.
    public static let tokenLifetime: Duration = .seconds(10)

    /// A Retry packet answering `initial` from `remote`, carrying a fresh token; nil if the
    /// Initial cannot be answered. The client's next Initial goes to `retryConnectionID`.
    /// The corresponding ngtcp2 functions are `ngtcp2_crypto_generate_retry_token` and
    /// `ngtcp2_crypto_write_retry`.
    public static func write(
        for initial: QUICInitialPacket, remote: QUICSocketAddress, secret: [UInt8], retryConnectionID: QUICConnectionID,
        now: QUICTime
    ) -> [UInt8]? {
        var token = [UInt8](repeating: 0, count: 1 + 1 + Int(NGTCP2_MAX_CIDLEN) + 8 + 16 + 32)
        var retryCID = retryConnectionID.ngtcp2CID
        var originalCID = initial.destinationConnectionID.ngtcp2CID
        let tokenLength = remote.withSockaddrBytes { address in
            token.withUnsafeMutableBufferPointer { t in
                secret.withUnsafeBufferPointer { s in
                    ngtcp2_crypto_generate_retry_token(
                        t.baseAddress, s.baseAddress, s.count, initial.version,
                        address.baseAddress!.assumingMemoryBound(to: ngtcp2_sockaddr.self), ngtcp2_socklen(address.count),
                        &retryCID, &originalCID, now.nanoseconds)
                }
            }
        }
        guard tokenLength > 0 else { return nil }
        var packet = [UInt8](repeating: 0, count: 256)
        var clientCID = initial.sourceConnectionID.ngtcp2CID
        let packetLength = packet.withUnsafeMutableBufferPointer { p in
            token.withUnsafeBufferPointer { t in
                ngtcp2_crypto_write_retry(
                    p.baseAddress, p.count, initial.version, &clientCID, &retryCID, &originalCID, t.baseAddress, Int(tokenLength))
            }
        }
        guard packetLength > 0 else { return nil }
        return Array(packet.prefix(Int(packetLength)))
    }

    /// The client's original destination connection ID if `initial` carries a valid, unexpired
    /// Retry token issued to `remote` by ``write(for:remote:secret:retryConnectionID:now:)``;
    /// nil otherwise (no token, a token of another kind, forged, expired or from another address).
    /// The corresponding ngtcp2 function is `ngtcp2_crypto_verify_retry_token`.
    public static func validate(_ initial: QUICInitialPacket, remote: QUICSocketAddress, secret: [UInt8], now: QUICTime) -> QUICConnectionID? {
        guard initial.token.first == UInt8(NGTCP2_CRYPTO_TOKEN_MAGIC_RETRY) else { return nil }
        var original = ngtcp2_cid()
        var destination = initial.destinationConnectionID.ngtcp2CID
        let rv = remote.withSockaddrBytes { address in
            initial.token.withUnsafeBufferPointer { t in
                secret.withUnsafeBufferPointer { s in
                    ngtcp2_crypto_verify_retry_token(
                        &original, t.baseAddress, t.count, s.baseAddress, s.count, initial.version,
                        address.baseAddress!.assumingMemoryBound(to: ngtcp2_sockaddr.self), ngtcp2_socklen(address.count),
                        &destination, UInt64(tokenLifetime.components.seconds) * 1_000_000_000, now.nanoseconds)
                }
            }
        }
        return rv == 0 ? QUICConnectionID(original) : nil
    }
}
