import ArgumentParser
import QXfer

/// Which transport carries a connection this tool makes (`--stack auto|quic|tls`).
enum StackChoice: String, ExpressibleByArgument, CaseIterable {
    /// QUIC and TCP+TLS raced (`FirstOf { QUIC(); TLS() }`): QUIC at once, TCP+TLS 250 ms
    /// later or as soon as QUIC fails; a host where QUIC was refused or silent while TCP+TLS won
    /// is remembered in the configuration folder (`stacks`), so a network that drops UDP starts
    /// with TCP+TLS next time (a race QUIC merely lost is not remembered).
    case auto
    case quic, tls

    /// The `--stack` help line every connecting command shares.
    static let help = ArgumentHelp(
        "Transport: auto (QUIC, falling back to TCP+TLS where UDP does not get through), quic or tls (TCP+TLS).",
        valueName: "auto|quic|tls")

    /// Runs `body` over the chosen stack, presenting `identity` and trusting the peer as `trust`
    /// says; `tcp` configures TCP under TLS; `config` holds the race's per-host memory and QUIC's
    /// session tickets (over `--stack quic` a sender resuming with one sends its first bytes as
    /// early data to a receiver it trusts; under `auto` too when `leadsEarly`, for a body that
    /// connects again after ``EarlyDataUnanswered``); `probesPathMTU` lets QUIC spend a round
    /// trip finding the path's datagram size (``QUIC/probesPathMTU``); `byCode` is for the
    /// local end of a code's path agent: a tunnel for QUIC (``QUIC/tunnelledThroughLoopback()``),
    /// and no host for the race's per-host memory. The one place the CLI turns the choice into a
    /// stack.
    func run<Body: OverChosenStack>(
        _ body: Body, identity: HostIdentity, trust: PeerTrust, tcp: TCP = TCP(), config: ConfigDirectory, probesPathMTU: Bool = false,
        leadsEarly: Bool = false, byCode: Bool = false
    ) async throws -> Body.Result {
        var quic = QUIC().identity(identity).peerTrust(trust).sessionTickets(SessionTicketStore(in: config)).pathMTUProbe(probesPathMTU)
        if byCode { quic = quic.tunnelledThroughLoopback() }
        let tls = TLS { tcp }.identity(identity).peerTrust(trust)
        // The last session ticket often arrives just before the answer the command waited for.
        do {
            let result = try await run(body, quic: quic, tls: tls, config: byCode ? nil : config, leadsEarly: leadsEarly)
            await SessionTicketStore.finishPendingSaves()
            return result
        } catch {
            await SessionTicketStore.finishPendingSaves()
            throw error
        }
    }

    private func run<Body: OverChosenStack>(
        _ body: Body, quic: QUIC, tls: TLS, config: ConfigDirectory?, leadsEarly: Bool
    ) async throws -> Body.Result {
        switch self {
        case .auto:
            let race = FirstOf { quic; tls }.remembering(config.map { StackMemory(in: $0) })
            return try await body.run(over: leadsEarly ? race.sendingEarly() : race)
        case .quic: return try await body.run(over: quic)
        case .tls: return try await body.run(over: tls)
        }
    }
}

/// What a command does once its stack is chosen, written once for every stack.
protocol OverChosenStack {
    associatedtype Result
    func run<Transport: SecureTransport>(over transport: Transport) async throws -> Result
}
