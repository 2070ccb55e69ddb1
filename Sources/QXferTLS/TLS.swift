@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity

/// The TCP layer's options.
public struct TCP: Sendable, Hashable {
    /// Options of the IP layer below.
    public var ip: IP
    /// `TCP_NODELAY`: send small writes at once; nil follows the performance mode.
    public var noDelay: Bool?
    /// TCP keepalive probing; nil leaves it off.
    public var keepAlive: KeepAlive?
    /// `TCP_USER_TIMEOUT`: how long sent data (or keepalive probes) may go unacknowledged
    /// before the connection fails; nil leaves the kernel's default (retransmissions for
    /// about 15 minutes).
    public var userTimeout: Duration?

    /// TCP keepalive timing.
    public struct KeepAlive: Sendable, Hashable {
        public var idle: Duration
        public var interval: Duration
        public var count: Int
        public init(idle: Duration = .seconds(15), interval: Duration = .seconds(5), count: Int = 4) {
            self.idle = idle
            self.interval = interval
            self.count = count
        }
    }

    public init() { self.ip = IP() }

    public init(@NetworkStackBuilder _ content: () -> IP) { self.ip = content() }

    /// Sets `TCP_NODELAY`.
    public func noDelay(_ enabled: Bool = true) -> TCP {
        var copy = self
        copy.noDelay = enabled
        return copy
    }

    /// Turns on keepalive probes, so a vanished peer is noticed on an otherwise idle connection.
    public func keepAlive(_ keepAlive: KeepAlive = KeepAlive()) -> TCP {
        var copy = self
        copy.keepAlive = keepAlive
        return copy
    }

    /// Fails the connection when what it sent (data or keepalive probes) stays unacknowledged
    /// for `timeout`: a peer cut off is noticed in that time rather than after the kernel's
    /// quarter of an hour of retransmissions (`TCP_USER_TIMEOUT`).
    public func userTimeout(_ timeout: Duration?) -> TCP {
        var copy = self
        copy.userTimeout = timeout
        return copy
    }
}

/// TLS 1.3 over TCP: qxfer's first transport.
///
/// Both sides present their ``HostIdentity``; the client checks the server against
/// ``PeerTrust`` (a pinned fingerprint, or known hosts with trust on first use) and the
/// server may require a client certificate from an allow-list (mutual TLS). ALPN `qxfer/1`
/// is required on both sides.
public struct TLS: Hashable, ByteStreamProtocol {
    /// Options of the TCP layer below.
    public var tcp: TCP
    /// Application protocols offered (client) or accepted (server); one must match.
    public var applicationProtocols: [String] = ["qxfer/1"]
    /// The identity presented to the peer; nil loads or creates the host identity.
    public var identity: HostIdentity?
    /// How a client decides whether to trust the server.
    public var peerTrust: PeerTrust = .knownHosts()
    /// What a server asks of clients.
    public var clientAuthentication: ClientAuthentication = .optional
    /// A listener's most open TCP connections, extra streams and datagram carriers included:
    /// one accepted beyond it is closed at once, until others end (as QUIC's listener ignores
    /// new clients past its 4096). Each costs a descriptor and a TLS session's memory, and a
    /// client may hold one open for the handshake timeout without sending anything.
    @_spi(Stacks) public var maximumConnections = 4096

    public init() { self.tcp = TCP() }

    public init(@NetworkStackBuilder _ content: () -> TCP) { self.tcp = content() }

    public var transport: TransportDescription { TransportDescription(TLSTransportStack(tls: self)) }

    /// Sets the ALPN protocols (default `qxfer/1`).
    public func applicationProtocols(_ protocols: [String]) -> TLS {
        var copy = self
        copy.applicationProtocols = protocols
        return copy
    }
}


extension TLS: SecureTransport {}
