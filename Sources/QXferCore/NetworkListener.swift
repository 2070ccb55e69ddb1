import Logging

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
    /// With this many clients still in their handshake, new ones first prove their address
    /// (QUIC's Retry round trip, RFC 9000 section 8.1.2). 0 validates every client.
    let retryAbovePendingHandshakes: Int

    private let bound = Locked<BoundState>(.unbound([]))
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
    public convenience init(on port: UInt16, host: String? = nil, using parameters: NetworkParameters<Stack>, handshakeTimeout: Duration = .seconds(10)) {
        self.init(on: port, host: host, using: parameters, handshakeTimeout: handshakeTimeout, retryAbovePendingHandshakes: 32)
    }

    init(on port: UInt16, host: String?, using parameters: NetworkParameters<Stack>, handshakeTimeout: Duration = .seconds(10),
         retryAbovePendingHandshakes: Int) {
        self.requestedPort = port
        self.host = host
        self.parameters = parameters
        self.handshakeTimeout = handshakeTimeout
        self.retryAbovePendingHandshakes = retryAbovePendingHandshakes
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
        try await run(refused: { _ in }, handler)
    }

    /// Accepts connections as ``run(_:)`` does, and tells `refused` of each client whose
    /// certificate the handshake refused (``ClientAuthentication``: not on the allow-list, not
    /// a paired device), with its address, fingerprint and the reason. Called on a stack's
    /// thread: keep it short.
    public func run(
        refused: @escaping @Sendable (RefusedClient) -> Void, _ handler: @escaping @Sendable (NetworkConnection<Stack>) async throws -> Void
    ) async throws {
        let stack = parameters.stack.transport.stack
        let request = ListenRequest(
            host: host, port: requestedPort, parameters: parameters, handshakeTimeout: handshakeTimeout,
            validateAddressesAbovePendingHandshakes: retryAbovePendingHandshakes, refused: refused)
        let listener: any BoundTransportListener
        do {
            listener = try await stack.bind(request)
        } catch {
            // Stacks report their own bind failures ("cannot listen on UDP port …").
            let failure = stack.describe(error, during: "listening")
            resolvePort(.failure(failure))
            throw failure
        }
        resolvePort(.success(listener.port))
        let parameters = self.parameters
        try await listener.run { transport, remote in
            await Self.serve(NetworkConnection(accepted: transport, parameters: parameters, remote: remote), handler: handler)
        }
    }

    /// Runs the application's handler; its end, error or cancellation closes the connection.
    private static func serve(
        _ connection: NetworkConnection<Stack>, handler: @Sendable (NetworkConnection<Stack>) async throws -> Void
    ) async {
        let remote = connection.endpoint
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
