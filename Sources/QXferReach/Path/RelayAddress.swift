/// Where a relay listens (docs/PROTOCOL.md §9.2): one host and one port number, TCP and UDP.
public struct RelayAddress: Sendable, Hashable, CustomStringConvertible {
    /// A name or a numeric address (IPv6 without brackets).
    public let host: String
    /// The relay's port number, for its control connections, splices and datagrams alike.
    public let port: UInt16

    /// The relay's default port number.
    public static let defaultPort: UInt16 = 7450

    /// An address from its parts; nil for an empty host or port 0.
    public init?(host: String, port: UInt16) {
        guard !host.isEmpty, port != 0, host.utf8.count <= 253,
              !host.contains(where: { $0.isWhitespace || $0 == "[" || $0 == "]" || $0 == "/" }) else { return nil }
        self.host = host
        self.port = port
    }

    /// Parses "host", "host:port", "[v6]", "[v6]:port" or a bare IPv6 address; nil for anything else.
    /// - Parameters:
    ///   - text: what the user wrote (`--relay`, `QXFER_RELAY`).
    ///   - defaultPort: the port when the text names none.
    public init?(parsing text: String, defaultPort: UInt16 = RelayAddress.defaultPort) {
        var host = Substring(text)
        var portText: Substring?
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            guard host.contains(":") else { return nil }
            if !rest.isEmpty {
                guard rest.hasPrefix(":") else { return nil }
                portText = rest.dropFirst()
            }
        } else if let colon = host.firstIndex(of: ":"), host[host.index(after: colon)...].contains(":") == false {
            portText = host[host.index(after: colon)...]
            host = host[..<colon]
        }
        // Otherwise several colons without brackets: a bare IPv6 address, the default port.
        var port = defaultPort
        if let portText {
            guard !portText.isEmpty, portText.utf8.count <= 5, portText.allSatisfy(\.isASCII), portText.allSatisfy(\.isNumber),
                  let value = UInt16(portText) else { return nil }
            port = value
        }
        self.init(host: String(host), port: port)
    }

    /// "host:port", with an IPv6 address in brackets.
    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}
