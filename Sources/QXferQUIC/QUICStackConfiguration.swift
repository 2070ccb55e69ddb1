internal import CQUICPacketProtection
import QUICEngine
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity

/// The engine configuration a ``QUIC`` stack and its parameters describe.
enum QUICStackConfiguration {
    /// The engine configuration for a stack and its parameters, for a connection with a peer
    /// on this host's loopback interface or elsewhere.
    static func make<Stack>(
        _ quic: QUIC, identity: HostIdentity, parameters: NetworkParameters<Stack>, verifier: PeerVerifier, isServer: Bool,
        peerIsLoopback: Bool, resetSecret: [UInt8]? = nil
    ) -> QUICConfiguration {
        let peerIsLoopback = peerIsLoopback && quic.loopbackIsThisHost
        var configuration = QUICConfiguration(
            certificateChainPEM: identity.certificatePEM, privateKeyPEM: identity.privateKeyPEM,
            verifyPeer: { verifier.evaluate(certificateDER: $0) })
        configuration.applicationProtocols = quic.applicationProtocols
        // GnuTLS runs the handshake; BoringSSL protects the packets (AES-GCM with VAES where the
        // CPU has it: docs/benchmarks.md, "QUIC at MTU 1500: the per-packet budget").
        configuration.packetProtection = QUICPacketProtection(backend: cquic_packet_protection_boringssl())
        if isServer {
            switch quic.clientAuthentication.kind {
            case .none: configuration.clientAuthentication = .none
            case .optional: configuration.clientAuthentication = .optional
            case .required: configuration.clientAuthentication = .required
            }
        }
        // BBR unless asked otherwise: on loopback the two are within noise of each other
        // (bench/loopback.sh: 352 vs 272 MB/s in one run, 272 vs 314 in another), but under
        // 1 % random loss CUBIC collapses where BBR holds (the brief's TCP figures: 57.6 MB/s
        // against under 0.5), and lossy WAN links are what qxfer is for. Realtime and bulk take
        // BBR v2: ngtcp2's BBR v1 cuts an application-limited flow's window to what is in flight
        // at every loss, which held frames back 17 ms or more after each one (docs/STREAMING.md),
        // and under 1 % random loss on a 50 ms, 500 Mbit/s path it moved a bulk transfer 10-20 %
        // slower than BBR v2 (docs/benchmarks.md, "Why QUIC overshot the emulated WAN").
        let defaultAlgorithm: CongestionControl = parameters.performanceMode == .default ? .bbr : .bbr2
        switch (parameters.congestionControl ?? defaultAlgorithm).name {
        case "bbr": configuration.congestionControl = .bbr
        case "bbr2": configuration.congestionControl = .bbr2
        case "reno": configuration.congestionControl = .reno
        default: configuration.congestionControl = .cubic
        }
        if let idle = parameters.idleTimeout {
            configuration.idleTimeout = idle
        } else {
            // "No idle timeout" on QUIC: keep the path alive, and notice a vanished peer in 30 s.
            configuration.idleTimeout = .seconds(30)
            configuration.keepAliveInterval = .seconds(10)
        }
        if !quic.loopbackIsThisHost { configuration.loopbackUDPPayloadSize = nil }
        if parameters.performanceMode == .bulk { configuration.applyBulkTransferLimits(overLoopback: peerIsLoopback) }
        if let resetSecret {
            configuration.statelessResetSecret = resetSecret
            if isServer { configuration.connectionIDPrefix = connectionIDPrefix(resetSecret: resetSecret) }
        }
        return configuration
    }

    /// The two bytes a listener's connection IDs begin with (``QUICSocketFilter``): derived from
    /// the identity's reset secret, so a restarted receiver still recognizes, and resets, the
    /// connections of its previous run; one-way, so they reveal nothing of the secret.
    static func connectionIDPrefix(resetSecret: [UInt8]) -> [UInt8] {
        let label = QUICConnectionID(Array("qxfer/1 connection-ID prefix".utf8.prefix(20)))!
        return Array(QUICStatelessReset.token(secret: resetSecret, connectionID: label).prefix(2))
    }
}
