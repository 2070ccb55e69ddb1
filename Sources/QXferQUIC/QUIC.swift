@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity

/// The UDP layer's options (under ``QUIC``).
public struct UDP: Sendable, Hashable {
    /// Options of the IP layer below.
    public var ip: IP

    public init() { self.ip = IP() }
    public init(@NetworkStackBuilder _ content: () -> IP) { self.ip = content() }
}

/// QUIC (RFC 9000) over UDP, with TLS 1.3 inside: qxfer's second transport.
///
/// Runs any program written for ``TLS`` unchanged: the connection's byte stream is the
/// client's first bidirectional QUIC stream. Trust works exactly as on TLS: the client pins
/// the server's fingerprint (explicitly or through known hosts), the server may require a
/// client certificate from an allow-list. ALPN `qxfer/1` is required on both sides.
public struct QUIC: ByteStreamProtocol, Hashable {
    /// Options of the UDP layer below.
    public var udp: UDP
    /// Application protocols offered (client) or accepted (server); one must match.
    public var applicationProtocols: [String]
    /// The identity presented to the peer; nil loads or creates the host identity.
    public var identity: HostIdentity?
    /// How a client decides whether to trust the server.
    public var peerTrust: PeerTrust = .knownHosts()
    /// What a server asks of clients.
    public var clientAuthentication: ClientAuthentication = .optional
    /// Where a client keeps session tickets per receiver to resume its next connection there
    /// (one round trip of certificate exchange saved, the receiver's certificate checked again);
    /// nil: every connection makes a full handshake. Listeners always issue tickets.
    public var sessionTickets: SessionTicketStore?
    /// Whether a client in `.performanceMode(.bulk)` first finds out how large a datagram the
    /// path carries and sends its packets at that size: up to 1 472 bytes of UDP payload on an
    /// Ethernet path (1 452 over IPv6), more below a jumbo-frame interface, where ngtcp2's own
    /// discovery stops at 1 444. Two datagrams of each size go to the server before the
    /// handshake; any QUIC server answers them (Version Negotiation), and only sizes it answered
    /// are used. Costs one round trip before the handshake (at most 1 s if nothing answers);
    /// not done for loopback peers or in other modes.
    public var probesPathMTU = true
    /// Whether a peer at a loopback address is on this host (datagrams up to 65 000 bytes,
    /// windows sized for a path with no delay), or the local end of a tunnel to a peer
    /// elsewhere, such as a transfer code's path agent (docs/PROTOCOL.md §9.5): datagrams and
    /// windows then as for any network path, and the datagram-size probe as for one.
    public var loopbackIsThisHost = true
    /// Client: whether a connection resuming with a ticket from a receiver this client trusts
    /// (by pin, `known_hosts` or pairing: the fingerprint kept with the ticket) is handed to the
    /// program before its handshake completes, so that the first bytes written travel as
    /// 0-RTT early data. A listener with an ``earlyDataRegister`` answers them at once: the
    /// reply comes one round trip after the first packet instead of two. Early bytes are not
    /// forward secret (docs/SECURITY.md, "What early data may carry"). Never in a race
    /// (``FirstOf``): whether UDP reaches the peer is known only once it answers.
    public var sendsEarlyData = true
    /// Listener: where the ClientHellos whose early data it took are recorded, so that each is
    /// taken once by every listener of this identity, in this process or another; with one, a
    /// resumed client's early data is read as soon as it arrives, half a round trip before the
    /// handshake completes. nil: early data waits for the handshake (then it cannot be replayed).
    public var earlyDataRegister: EarlyDataRegister?

    /// A listener's connection receive windows, all together, in bytes (beyond 256 KiB per
    /// connection, which each gets whatever is left): what its peers may have sent that the
    /// application has not read yet. nil: an eighth of the memory this process can have (the
    /// machine's, or its control group's limit if lower), 64 MiB to 2 GiB.
    @_spi(Stacks) public var receiveWindowBudget: Int?

    public init(alpn: [String] = ["qxfer/1"]) {
        self.udp = UDP()
        self.applicationProtocols = alpn
    }

    public init(alpn: [String] = ["qxfer/1"], @NetworkStackBuilder _ content: () -> UDP) {
        self.udp = content()
        self.applicationProtocols = alpn
    }

    public var transport: TransportDescription { TransportDescription(QUICTransportStack(quic: self)) }

    /// Keeps session tickets in `store` and resumes with them (``sessionTickets``).
    public func sessionTickets(_ store: SessionTicketStore?) -> QUIC { with { $0.sessionTickets = store } }

    /// Sends a resumed connection's first bytes as early data, or not (``sendsEarlyData``).
    public func earlyData(_ enabled: Bool) -> QUIC { with { $0.sendsEarlyData = enabled } }

    /// Reads resumed clients' early data at once, recording it in `register` (``earlyDataRegister``).
    public func earlyDataRegister(_ register: EarlyDataRegister?) -> QUIC { with { $0.earlyDataRegister = register } }

    /// Turns the probe for the path's datagram size on or off (``probesPathMTU``): off where a
    /// round trip matters more than 2 % more data per packet, as for a few small files.
    public func pathMTUProbe(_ enabled: Bool) -> QUIC { with { $0.probesPathMTU = enabled } }

    /// Treats a peer at a loopback address as the local end of a tunnel (``loopbackIsThisHost``).
    public func tunnelledThroughLoopback() -> QUIC { with { $0.loopbackIsThisHost = false } }

    private func with(_ change: (inout QUIC) -> Void) -> QUIC {
        var copy = self
        change(&copy)
        return copy
    }
}

extension QUIC: SecureTransport {}
