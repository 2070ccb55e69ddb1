import ArgumentParser
import QXfer

/// Which transport carries a connection this tool makes (`--stack quic|tls`).
enum StackChoice: String, ExpressibleByArgument, CaseIterable {
    case quic, tls

    /// Runs `body` over the chosen stack, presenting `identity` and trusting the peer as `trust`
    /// says; `tcp` configures TCP under TLS. The one place the CLI turns the choice into a stack.
    func run<Body: OverChosenStack>(_ body: Body, identity: HostIdentity, trust: PeerTrust, tcp: TCP = TCP()) async throws -> Body.Result {
        switch self {
        case .quic: try await body.run(over: QUIC().identity(identity).peerTrust(trust))
        case .tls: try await body.run(over: TLS { tcp }.identity(identity).peerTrust(trust))
        }
    }
}

/// What a command does once its stack is chosen, written once for every stack.
protocol OverChosenStack {
    associatedtype Result
    func run<Transport: SecureTransport>(over transport: Transport) async throws -> Result
}
