@_spi(Stacks) import QXferCore

/// Finds services on the local network with DNS-SD over multicast DNS (RFC 6762, RFC 6763).
///
/// ```swift
/// let receiver = try await NetworkBrowser(for: .dnssd(type: "_qxfer._udp")).run { endpoints in
///     endpoints.first.map { .finish($0) } ?? .continue
/// }
/// let connection = NetworkConnection(to: receiver) { QUIC() }
/// ```
///
/// Each endpoint carries its ``DiscoveredService`` (``Endpoint/service``): instance name,
/// addresses, port and TXT attributes. Browsing coexists with avahi-daemon and other mDNS
/// responders on the same host (the port is shared). Cancelling the task stops browsing and
/// closes every socket.
public struct NetworkBrowser: Sendable {
    /// What to browse for.
    public struct Descriptor: Hashable, Sendable {
        /// The service type, such as `_qxfer._udp`.
        public let type: String
        /// The domain; multicast DNS serves `local`.
        public let domain: String

        /// Services of a DNS-SD type in the `local` domain.
        public static func dnssd(type: String, domain: String = "local") -> Descriptor {
            Descriptor(type: type, domain: domain)
        }
    }

    /// What ``run(_:)`` does after the closure has seen a set of endpoints.
    public enum Decision: Sendable {
        /// Stop browsing; `run` returns this endpoint.
        case finish(Endpoint)
        /// Keep browsing; the closure is called again when the set changes.
        case `continue`
    }

    /// What this browser looks for.
    public let descriptor: Descriptor
    /// The interfaces to browse on; nil means every interface that is up and multicast-capable.
    public let interfaces: [String]?

    /// A browser for `descriptor`, on every suitable interface or only on `interfaces`.
    public init(for descriptor: Descriptor, interfaces: [String]? = nil) {
        self.descriptor = descriptor
        self.interfaces = interfaces
    }

    /// Browses until `body` returns `.finish`.
    ///
    /// `body` receives the current endpoints, sorted by instance name, each time the set
    /// changes: when a service appears (resolved to an address and port), changes, or
    /// disappears (a goodbye or an expired TTL). It is not called before the first service
    /// appears.
    ///
    /// - Returns: The endpoint `body` finished with.
    /// - Throws: ``QXferError`` with code `bind-failed` when no interface can do multicast
    ///   DNS; `CancellationError` when the task is cancelled; whatever `body` throws.
    public func run(_ body: ([Endpoint]) async throws -> Decision) async throws -> Endpoint {
        let (updates, continuation) = AsyncStream.makeStream(of: [DiscoveredService].self, bufferingPolicy: .bufferingNewest(1))
        let interfaces = MDNSSockets.interfaces(named: self.interfaces)
        let querier = MDNSQuerier(serviceType: descriptor.type, domain: descriptor.domain, interfaces: interfaces)
        let session = try await MDNSSession.open(querier, interfaces: interfaces) { machine in
            continuation.yield(machine.services)
        }
        do {
            let endpoint = try await withTaskCancellationHandler {
                var current: [DiscoveredService] = []
                for await services in updates where services != current {
                    current = services
                    if case .finish(let endpoint) = try await body(services.compactMap(Endpoint.service)) {
                        return endpoint
                    }
                }
                throw CancellationError()
            } onCancel: {
                continuation.finish()
            }
            continuation.finish()
            await session.shutdown()
            return endpoint
        } catch {
            continuation.finish()
            await session.shutdown()
            throw error
        }
    }

    /// Finds one service: the one named `name` as soon as it answers, or, with no name, the
    /// only one that answers within `timeout`.
    ///
    /// With no name, browsing stops `settle` after the first answer (others answering the
    /// same query arrive within milliseconds), or at `timeout`.
    ///
    /// - Throws: ``QXferError`` `service-not-found` when nothing (or nothing of that name)
    ///   answered in time, `ambiguous-service` when several answered and no name was given;
    ///   its message lists them.
    public func resolve(named name: String? = nil, timeout: Duration = .seconds(3), settle: Duration = .milliseconds(1500)) async throws -> Endpoint {
        let seen = ResolveProgress()
        let clock = ContinuousClock()
        let found: Endpoint? = try await withThrowingTaskGroup(of: Endpoint?.self) { group in
            group.addTask {
                try await run { endpoints in
                    seen.withLock { state in
                        state.endpoints = endpoints
                        if state.firstAt == nil, !endpoints.isEmpty { state.firstAt = clock.now }
                    }
                    if let name, let match = endpoints.first(where: { Self.matches($0, name) }) { return .finish(match) }
                    return .continue
                }
            }
            group.addTask {
                let deadline = clock.now + timeout
                while clock.now < deadline {
                    try await Task.sleep(for: .milliseconds(50))
                    if name == nil, let first = seen.withLock({ $0.firstAt }), clock.now - first >= settle { break }
                }
                return nil
            }
            defer { group.cancelAll() }
            return try await group.next() ?? nil
        }
        if let found { return found }
        let endpoints = seen.withLock { $0.endpoints }
        let list = endpoints.map { $0.service?.description ?? $0.description }.joined(separator: ", ")
        if let name {
            throw QXferError(.serviceNotFound, endpoints.isEmpty
                ? "no receiver named '\(name)' answered within \(Self.seconds(timeout)) (none answered at all)"
                : "no receiver named '\(name)' answered within \(Self.seconds(timeout)); found: \(list)")
        }
        switch endpoints.count {
        case 0:
            throw QXferError(.serviceNotFound, "no \(descriptor.type) service answered within \(Self.seconds(timeout))")
        case 1:
            return endpoints[0]
        default:
            throw QXferError(.ambiguousService, "\(endpoints.count) services answer: \(list); choose one by name")
        }
    }

    /// What the browsing task has seen, for the timer task to judge.
    private final class ResolveProgress: Sendable {
        let state = Locked<(endpoints: [Endpoint], firstAt: ContinuousClock.Instant?)>(([], nil))
        func withLock<T: Sendable>(_ body: (inout (endpoints: [Endpoint], firstAt: ContinuousClock.Instant?)) -> T) -> T {
            state.withLock { body(&$0) }
        }
    }

    private static func matches(_ endpoint: Endpoint, _ name: String) -> Bool {
        endpoint.service?.name.lowercased() == name.lowercased()
    }

    private static func seconds(_ duration: Duration) -> String {
        let milliseconds = duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
        return milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(Double(milliseconds) / 1000) s"
    }
}
