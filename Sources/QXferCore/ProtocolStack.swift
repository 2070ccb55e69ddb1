/// Builds a protocol stack from a declaration such as `TLS { TCP { IP() } }`.
///
/// Each layer is a concrete type, so the stack keeps its full type and
/// ``NetworkConnection`` offers exactly the operations its top layer supports
/// (bytes for `TLS()`, typed messages for `Coder(…)`, typed frames for `TLV { … }`).
@resultBuilder
public enum NetworkStackBuilder {
    public static func buildBlock<Layer>(_ layer: Layer) -> Layer { layer }
}

/// A complete stack that a ``NetworkConnection`` or ``NetworkListener`` can run.
public protocol NetworkProtocolStack: Sendable {
    /// The transport at the bottom of the stack, with its options.
    var transport: TransportDescription { get }
}

/// A stack whose top layer is a reliable, ordered byte stream: `TLS()` or `QUIC()`.
///
/// Framers (``TLV``, ``Coder``) sit on top of any byte-stream protocol.
public protocol ByteStreamProtocol: NetworkProtocolStack {}

/// What carries the bytes and how it is configured; built by the stack's layers.
///
/// Opaque on purpose: applications describe stacks with `TLS()`, `QUIC()` and their
/// modifiers, never by filling this in.
public struct TransportDescription: Sendable {
    /// The stack that connects and listens; the API talks to it only through ``TransportStack``.
    @_spi(Stacks) public let stack: any TransportStack

    @_spi(Stacks) public init(_ stack: any TransportStack) { self.stack = stack }

    /// Whether one connection carries many ordered streams side by side and unreliable
    /// datagrams (QUIC). False on TCP+TLS, where each extra stream is a connection of its own
    /// (a TCP and TLS handshake per stream) and "datagrams" are delivered reliably and in
    /// order: the calls work there, but a plan built on cheap streams or on dropping late
    /// datagrams gains nothing. Applications that can use either ask this once.
    public var hasIndependentStreams: Bool { stack.hasIndependentStreams }
}
