/// Where a connection goes: a host name or address, and a port.
public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
    /// A host name (resolved at connect time, all addresses raced) or a literal address.
    public let host: String
    /// The port.
    public let port: UInt16
    /// The DNS-SD service this endpoint was found as (see ``NetworkBrowser``); nil otherwise.
    public let service: DiscoveredService?

    /// An endpoint given by host and port. Names resolve when the connection starts; every
    /// address is tried, IPv6 and IPv4 raced as RFC 8305 (Happy Eyeballs) describes.
    public static func hostPort(host: String, port: UInt16) -> Endpoint {
        Endpoint(host: host, port: port)
    }

    /// Parses `HOST`, `HOST:PORT` or `[IPV6]:PORT`, using `defaultPort` when none is given.
    /// nil for an empty host or port 0 (nothing can be reached there).
    public init?(parsing text: String, defaultPort: UInt16) {
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            let host = String(text[text.index(after: text.startIndex)..<close])
            let rest = text[text.index(after: close)...]
            guard !host.isEmpty else { return nil }
            if rest.isEmpty {
                self.init(host: host, port: defaultPort)
            } else {
                guard rest.hasPrefix(":"), let port = UInt16(rest.dropFirst()), port > 0 else { return nil }
                self.init(host: host, port: port)
            }
        } else if text.filter({ $0 == ":" }).count == 1 {
            let parts = text.split(separator: ":", omittingEmptySubsequences: false)
            guard let port = UInt16(parts[1]), port > 0, !parts[0].isEmpty else { return nil }
            self.init(host: String(parts[0]), port: port)
        } else {
            guard !text.isEmpty else { return nil }
            self.init(host: text, port: defaultPort)  // a name, or a bare IPv6 address
        }
    }

    @_spi(Stacks) public init(host: String, port: UInt16, service: DiscoveredService? = nil) {
        self.host = host
        self.port = port
        self.service = service
    }

    /// `host:port`, with IPv6 literals in brackets.
    public var description: String {
        host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }
}
