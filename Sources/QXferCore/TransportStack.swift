/// The seam between the connection API and a transport stack (TCP+TLS, QUIC, or a stack built
/// from others, such as one racing two of them).
///
/// ``NetworkConnection`` and ``NetworkListener`` know stacks only through this protocol: a new
/// stack is a new target whose public layer type (`TLS()`, `QUIC()`) returns a
/// ``TransportDescription`` wrapping its own conformance; nothing in this target changes.
@_spi(Stacks) public protocol TransportStack: Sendable {
    /// The stack's name in messages and logs ("TCP+TLS", "QUIC").
    var name: String { get }

    /// Whether a connection carries independent streams and unreliable datagrams
    /// (see ``TransportDescription/hasIndependentStreams``).
    var hasIndependentStreams: Bool { get }

    /// Establishes one connection to `endpoint` and completes its handshake within `timeout`.
    ///
    /// Calls `peerAnswered` (at most once, from any thread) as soon as something at `endpoint`
    /// is known to speak this stack, before the handshake completes: TCP's connection, QUIC's
    /// first datagram back. A stack racing others gives an attempt that has answered its
    /// handshake's time rather than counting its silence as "nothing listens".
    ///
    /// Throws a ``QXferError``; ``QXferError/Code/connectFailed`` means the attempt may succeed
    /// later (the connection retries it with backoff until its connect timeout).
    func connect<Stack>(
        to endpoint: Endpoint, parameters: NetworkParameters<Stack>, timeout: Duration,
        peerAnswered: @escaping @Sendable () -> Void
    ) async throws -> any ByteStreamTransport

    /// Binds the listening socket(s) a listener asks for; throws a ``QXferError`` when it cannot.
    func bind<Stack>(_ request: ListenRequest<Stack>) async throws -> any BoundTransportListener

    /// This stack as one candidate of a race: `connect` must not return before the peer has
    /// answered, or the race would pick it unheard (QUIC otherwise returns a resumed connection
    /// at once, to send early data).
    func racing() -> any TransportStack

    /// Whether `connect` to `endpoint` would return at once and hand the first bytes over as
    /// early data (QUIC resuming with a ticket from a receiver this host trusts); a race that
    /// lets its leader send early asks (``FirstOf/sendingEarly(answerWithin:)``).
    func sendsEarly<Stack>(to endpoint: Endpoint, parameters: NetworkParameters<Stack>) -> Bool

    /// One line a user understands for an error this stack's I/O raised during `what`
    /// ("the connection"); a ``QXferError`` is returned as it is.
    func describe(_ error: any Error, during what: String) -> QXferError
}

extension TransportStack {
    @_spi(Stacks) public func racing() -> any TransportStack { self }
    @_spi(Stacks) public func sendsEarly<Stack>(to endpoint: Endpoint, parameters: NetworkParameters<Stack>) -> Bool { false }
}

/// What a ``NetworkListener`` asks of a stack's ``TransportStack/bind(_:)``.
@_spi(Stacks) public struct ListenRequest<Stack: NetworkProtocolStack>: Sendable {
    /// The address to bind; nil binds every address (IPv6 and IPv4).
    @_spi(Stacks) public var host: String?
    /// The port; 0 picks a free one.
    @_spi(Stacks) public var port: UInt16
    /// The parameters accepted connections use.
    @_spi(Stacks) public var parameters: NetworkParameters<Stack>
    /// How long a client may take to complete its handshake before it is dropped.
    @_spi(Stacks) public var handshakeTimeout: Duration
    /// With this many clients still in their handshake, new ones first prove their address
    /// (QUIC's Retry); stacks without such a round trip ignore it.
    @_spi(Stacks) public var validateAddressesAbovePendingHandshakes: Int
    /// Told of each client whose certificate the handshake refused (``ClientAuthentication``).
    @_spi(Stacks) public var refused: @Sendable (RefusedClient) -> Void = { _ in }
}

/// A client a listener refused during its handshake because of the certificate it presented
/// (not on the allow-list, not a paired device): who it was and why.
public struct RefusedClient: Sendable, CustomStringConvertible {
    /// Its address, as the listener saw it (nil if the stack did not tell).
    public let address: Endpoint?
    /// The fingerprint of the certificate it presented (nil if it presented none).
    public let fingerprint: Fingerprint?
    /// Why it was refused ("it is not on the allow-list").
    public let reason: QXferError

    @_spi(Stacks) public init(address: Endpoint?, fingerprint: Fingerprint?, reason: QXferError) {
        self.address = address
        self.fingerprint = fingerprint
        self.reason = reason
    }

    /// "refused 192.0.2.7:50123 (fingerprint …): it is not on the allow-list".
    public var description: String {
        "refused \(address?.description ?? "a client")\(fingerprint.map { " (fingerprint \($0))" } ?? ""): \(reason.message)"
    }
}

/// A stack's bound listening socket(s), accepting once ``run(serving:)`` is called.
@_spi(Stacks) public protocol BoundTransportListener: Sendable {
    /// The port bound.
    var port: UInt16 { get }

    /// Accepts connections until the task is cancelled, calling `serve` for each established
    /// (handshaken and admitted) connection in a child task of its own, with the peer's
    /// address if known. Closes the socket(s) before returning.
    func run(serving serve: @escaping @Sendable (any ByteStreamTransport, Endpoint?) async -> Void) async throws
}
