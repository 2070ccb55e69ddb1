/// Binding an application protocol to this connection's TLS session.
extension NetworkConnection {
    /// A TLS exporter value (RFC 8446 section 7.5): `length` bytes that both ends of this
    /// connection, and nobody else, compute alike from `label` and `context`. An application
    /// mixes it into its own authentication (a PAKE, a signature) so that a result obtained on
    /// one connection cannot be replayed on another.
    ///
    /// Both stacks: QUIC asks GnuTLS; on TCP+TLS, where swift-nio-ssl offers no exporter, the
    /// value is derived as RFC 8446 defines it from the exporter secret BoringSSL logs for the
    /// connection (checked against `openssl s_client -keymatexport`). Extra streams of a TLS
    /// connection have none of their own: use the connection's.
    public func exportKeyingMaterial(label: String, context: [UInt8] = [], length: Int = 32) async throws -> [UInt8] {
        try await transport().exportKeyingMaterial(label: label, context: context, length: length)
    }
}
