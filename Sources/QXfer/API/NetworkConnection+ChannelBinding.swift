/// Binding an application protocol to this connection's TLS session.
extension NetworkConnection {
    /// A TLS exporter value (RFC 8446 section 7.5): `length` bytes that both ends of this
    /// connection, and nobody else, compute alike from `label` and `context`. An application
    /// mixes it into its own authentication (a PAKE, a signature) so that a result obtained on
    /// one connection cannot be replayed on another.
    ///
    /// QUIC only: swift-nio-ssl, under the TCP+TLS stack, offers no exporter; there this throws
    /// ``QXferError/Code/unsupported``, and applications bind to the certificate fingerprints,
    /// which the TLS handshake proves, instead.
    public func exportKeyingMaterial(label: String, context: [UInt8] = [], length: Int = 32) async throws -> [UInt8] {
        try await transport().exportKeyingMaterial(label: label, context: context, length: length)
    }
}
