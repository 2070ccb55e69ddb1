import Logging
@_spi(Stacks) import QXferCore

#if canImport(Glibc)
import Glibc
#endif

/// Advertises a service on the local network with DNS-SD over multicast DNS for as long as its
/// task runs.
///
/// ```swift
/// let service = DNSSDService(name: "office-pc", type: "_qxfer._udp", port: 4433, txt: ["fp": fingerprint])
/// try await NetworkAdvertiser(service).run { name in print("advertised as \(name)") }
/// ```
///
/// The advertiser probes before claiming the name, renames on a conflict ("office-pc (2)"),
/// announces, answers queries, and when its task is cancelled sends a goodbye so browsers
/// drop the entry at once, then closes its sockets.
public struct NetworkAdvertiser: Sendable {
    /// What is advertised.
    public let service: DNSSDService
    /// The interfaces to advertise on; nil means every interface that is up and multicast-capable.
    public let interfaces: [String]?

    private static var logger: Logger { Logger(label: "qxfer.discovery") }

    /// An advertiser for `service`.
    public init(_ service: DNSSDService, interfaces: [String]? = nil) {
        self.service = service
        self.interfaces = interfaces
    }

    /// Advertises until the task is cancelled, then says goodbye and returns.
    ///
    /// - Parameter registered: Called with the instance name each time the service is
    ///   established under it: once at first, and again after a conflict renamed it.
    /// - Throws: ``QXferError`` `bind-failed` when no interface can do multicast DNS.
    public func run(registered: @escaping @Sendable (String) async -> Void = { _ in }) async throws {
        let (events, continuation) = AsyncStream.makeStream(of: MDNSResponder.Event.self)
        let interfaces = MDNSSockets.interfaces(named: self.interfaces)
        let responder = MDNSResponder(service: service, hostLabel: service.hostName ?? Self.localHostLabel(), interfaces: interfaces)
        let session = try await MDNSSession.open(responder, interfaces: interfaces) { machine in
            for event in machine.takeEvents() { continuation.yield(event) }
        }
        await withTaskCancellationHandler {
            for await event in events {
                switch event {
                case .registered(let name):
                    Self.logger.info("advertising \(service.type) as '\(name)' on port \(service.port)")
                    await registered(name)
                case .renamed(let old, let new):
                    Self.logger.notice("another host uses '\(old)'; advertising as '\(new)'")
                }
            }
        } onCancel: {
            continuation.finish()
        }
        await session.shutdown()
    }

    /// The machine's host name as a DNS label: its first label, letters, digits and hyphens only.
    static func localHostLabel() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "qxfer" }
        let bytes = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        let name = String(decoding: bytes, as: UTF8.self).split(separator: ".").first.map(String.init) ?? ""
        let cleaned = String(name.unicodeScalars.filter { $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "-") }
            .map(Character.init)).prefix(DNSName.maximumLabelLength)
        return cleaned.isEmpty ? "qxfer" : String(cleaned)
    }
}

extension NetworkListener {
    /// Accepts connections as ``run(_:)`` does while advertising `service` with DNS-SD; the
    /// advertisement starts once the port is bound and ends (with a goodbye) when this task ends.
    ///
    /// A `service.port` of 0 is replaced by the port the listener bound. Advertising is a
    /// convenience: if multicast DNS cannot run here the listener keeps listening and the
    /// failure is logged.
    public func run(
        advertising service: DNSSDService, interfaces: [String]? = nil,
        registered: @escaping @Sendable (String) async -> Void = { _ in },
        _ handler: @escaping @Sendable (NetworkConnection<Stack>) async throws -> Void
    ) async throws {
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await self.run(handler) }
            group.addTask {
                guard let port = try? await self.port else { return }
                var service = service
                if service.port == 0 { service.port = port }
                do {
                    try await NetworkAdvertiser(service, interfaces: interfaces).run(registered: registered)
                } catch {
                    Logger(label: "qxfer.discovery").warning("not advertising on the local network: \(error)")
                }
            }
        }
    }
}
