import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// Accepts connections on a port and runs each in its own child task.
///
/// ```swift
/// try await NetworkListener(on: 4433) { TLS() }.run { connection in
///     let request = try await connection.receive(atLeast: 1, atMost: 1024).content
///     try await connection.send(request)
/// }
/// ```
///
/// `run` returns only when its task is cancelled (or binding fails); cancelling it stops
/// accepting, cancels every connection's task and closes every connection.
public final class NetworkListener<Stack: NetworkProtocolStack>: Sendable {
    /// The stack and parameters each accepted connection uses.
    public let parameters: NetworkParameters<Stack>
    /// The address to bind; nil binds every address (IPv6 and IPv4).
    public let host: String?
    /// The requested port (0 picks a free one; see ``port``).
    public let requestedPort: UInt16
    /// How long a client may take to complete its handshake before it is dropped.
    public let handshakeTimeout: Duration

    private let bound = Mutex<BoundState>(.unbound([]))
    private static var logger: Logger { Logger(label: "qxfer.listener") }

    private enum BoundState {
        case unbound([CheckedContinuation<UInt16, any Error>])
        case bound(UInt16)
        case failed(QXferError)
    }

    /// A listener for a stack declaration.
    public convenience init(on port: UInt16, host: String? = nil, @NetworkStackBuilder _ stack: () -> Stack) {
        self.init(on: port, host: host, using: .parameters(stack))
    }

    /// A listener with explicit parameters.
    public init(on port: UInt16, host: String? = nil, using parameters: NetworkParameters<Stack>, handshakeTimeout: Duration = .seconds(10)) {
        self.requestedPort = port
        self.host = host
        self.parameters = parameters
        self.handshakeTimeout = handshakeTimeout
    }

    /// The port the listener is bound to; waits until `run` has bound it.
    public var port: UInt16 {
        get async throws {
            try await withCheckedThrowingContinuation { continuation in
                let result: Result<UInt16, QXferError>? = bound.withLock { state in
                    switch state {
                    case .unbound(var waiters):
                        waiters.append(continuation)
                        state = .unbound(waiters)
                        return nil
                    case .bound(let port): return .success(port)
                    case .failed(let error): return .failure(error)
                    }
                }
                if let result { continuation.resume(with: result) }
            }
        }
    }

    /// Accepts connections until the task is cancelled, calling `handler` for each in a child
    /// task. A handler's error closes its connection and is logged; it never stops the listener.
    public func run(_ handler: @escaping @Sendable (NetworkConnection<Stack>) async throws -> Void) async throws {
        switch parameters.stack.transport.kind {
        case .tls(let tls):
            try await runTLS(tls, handler)
        }
    }

    private func runTLS(_ tls: TLS, _ handler: @escaping @Sendable (NetworkConnection<Stack>) async throws -> Void) async throws {
        let server: NIOAsyncChannel<TLSByteStream.Setup, Never>
        let verifierFactory: @Sendable () -> PeerVerifier
        do {
            let identity = try tls.identity ?? HostIdentity.loadOrCreate()
            let context = try TLSByteStream.makeContext(identity: identity, tls: tls, role: .server(tls.clientAuthentication))
            let settings = SocketTuning.Settings(parameters, tcp: tls.tcp)
            let idle = parameters.idleTimeout
            verifierFactory = { PeerVerifier(.server(tls.clientAuthentication)) }
            let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .serverChannelOption(.backlog, value: 256)
            let initializer: @Sendable (any Channel) -> EventLoopFuture<TLSByteStream.Setup> = { channel in
                channel.eventLoop.makeCompletedFuture {
                    SocketTuning.apply(settings, to: channel)
                    let verifier = verifierFactory()
                    let tlsHandler = NIOSSLServerHandler(context: context, customVerificationCallback: verifier.verify)
                    var setup = try TLSByteStream.Setup.install(tlsHandler, verifier: verifier, tls: tls, idle: idle, on: channel)
                    setup.verifier = verifier
                    return setup
                }
            }
            if let host {
                server = try await bootstrap.bind(host: host, port: Int(requestedPort), childChannelInitializer: initializer)
            } else {
                do {
                    server = try await bootstrap.bind(host: "::", port: Int(requestedPort), childChannelInitializer: initializer)
                } catch {
                    // No IPv6 on this host (or in this namespace): IPv4 only.
                    server = try await bootstrap.bind(host: "0.0.0.0", port: Int(requestedPort), childChannelInitializer: initializer)
                }
            }
        } catch {
            let failure = (error as? QXferError)
                ?? QXferError(.bindFailed, "cannot listen on port \(requestedPort): \(TLSErrors.reason(error))", underlying: error)
            resolvePort(.failure(failure))
            throw failure
        }
        resolvePort(.success(UInt16(server.channel.localAddress?.port ?? Int(requestedPort))))

        let parameters = self.parameters
        let handshakeTimeout = self.handshakeTimeout
        try await server.executeThenClose { inbound in
            await withDiscardingTaskGroup { group in
                do {
                    for try await setup in inbound {
                        group.addTask {
                            await Self.serve(setup, parameters: parameters, handshakeTimeout: handshakeTimeout, handler: handler)
                        }
                    }
                } catch {
                    Self.logger.debug("listener stopped accepting: \(error)")
                }
            }
        }
    }

    private static func serve(
        _ setup: TLSByteStream.Setup, parameters: NetworkParameters<Stack>, handshakeTimeout: Duration,
        handler: @Sendable (NetworkConnection<Stack>) async throws -> Void
    ) async {
        let remote = setup.channel.remoteAddress.flatMap { address -> Endpoint? in
            guard let ip = address.ipAddress, let port = address.port else { return nil }
            return .hostPort(host: ip, port: UInt16(port))
        }
        let stream: TLSByteStream
        do {
            stream = try await setup.finishHandshake(
                verifier: setup.verifier!, peerName: remote?.description ?? "a client", timeout: handshakeTimeout)
        } catch {
            logger.debug("refused \(remote?.description ?? "a client"): \(error)")
            return
        }
        let connection = NetworkConnection(accepted: stream, parameters: parameters, remote: remote)
        do {
            try await withTaskCancellationHandler {
                try await handler(connection)
            } onCancel: {
                connection.cancel()
            }
        } catch {
            logger.debug("connection from \(remote?.description ?? "a client") ended: \(error)")
        }
        connection.cancel()
    }

    private func resolvePort(_ result: Result<UInt16, QXferError>) {
        let waiters: [CheckedContinuation<UInt16, any Error>] = bound.withLock { state in
            guard case .unbound(let waiters) = state else { return [] }
            switch result {
            case .success(let port): state = .bound(port)
            case .failure(let error): state = .failed(error)
            }
            return waiters
        }
        for waiter in waiters { waiter.resume(with: result.mapError { $0 as any Error }) }
    }
}
