/// The key/value attributes of a DNS-SD service (RFC 6763 section 6): `key=value` strings,
/// keys matched without case, the first occurrence of a key winning.
///
/// ```swift
/// let txt: TXTRecord = ["fp": fingerprint.description, "txtvers": "1"]
/// txt["FP"]   // the same value
/// ```
public struct TXTRecord: Hashable, Sendable, ExpressibleByDictionaryLiteral, CustomStringConvertible {
    /// One attribute: a value of nil is a boolean attribute (a key alone, no `=`).
    public struct Entry: Hashable, Sendable {
        public var key: String
        public var value: String?
        public init(key: String, value: String?) {
            self.key = key
            self.value = value
        }
    }

    /// The attributes in the order they are sent.
    public private(set) var entries: [Entry] = []

    /// An empty record.
    public init() {}

    /// Attributes in the given order.
    public init(_ entries: [Entry]) {
        for entry in entries { self[entry.key] = entry.value }
    }

    public init(dictionaryLiteral elements: (String, String)...) {
        for (key, value) in elements { self[key] = value }
    }

    /// The value of `key`, matched without ASCII case; nil when absent or a boolean attribute.
    /// Setting nil removes the key.
    public subscript(key: String) -> String? {
        get { entries.first { $0.key.lowercased() == key.lowercased() }?.value }
        set {
            if let index = entries.firstIndex(where: { $0.key.lowercased() == key.lowercased() }) {
                if let newValue { entries[index].value = newValue } else { entries.remove(at: index) }
            } else if let newValue, Self.isValidKey(key) {
                entries.append(Entry(key: key, value: newValue))
            }
        }
    }

    /// Whether `key` is present, with or without a value.
    public func contains(_ key: String) -> Bool {
        entries.contains { $0.key.lowercased() == key.lowercased() }
    }

    /// `key=value` pairs separated by spaces.
    public var description: String {
        entries.map { entry in entry.value.map { "\(entry.key)=\($0)" } ?? entry.key }.joined(separator: " ")
    }

    /// RFC 6763 section 6.4: printable ASCII but `=`, at least one character, at most 9
    /// recommended (we allow up to 255 so foreign records survive).
    @_spi(Stacks) public static func isValidKey(_ key: String) -> Bool {
        !key.isEmpty && key.utf8.count <= 255 && key.utf8.allSatisfy { (0x20...0x7E).contains($0) && $0 != UInt8(ascii: "=") }
    }

    /// The character strings on the wire; entries that do not fit 255 bytes are left out.
    @_spi(Stacks) public var strings: [[UInt8]] {
        entries.compactMap { entry in
            let bytes = Array(entry.key.utf8) + (entry.value.map { [UInt8(ascii: "=")] + Array($0.utf8) } ?? [])
            return bytes.count <= 255 ? bytes : nil
        }
    }

    /// Reads the strings of a received TXT record; empty strings and empty keys are skipped,
    /// and a repeated key keeps its first value (RFC 6763 section 6.4).
    @_spi(Stacks) public init(strings: [[UInt8]]) {
        for string in strings where !string.isEmpty {
            let key: String
            let value: String?
            if let equals = string.firstIndex(of: UInt8(ascii: "=")) {
                key = String(decoding: string[..<equals], as: UTF8.self)
                value = String(decoding: string[(equals + 1)...], as: UTF8.self)
            } else {
                key = String(decoding: string, as: UTF8.self)
                value = nil
            }
            guard Self.isValidKey(key), !contains(key) else { continue }
            entries.append(Entry(key: key, value: value))
        }
    }
}

/// A service to advertise with DNS-SD over multicast DNS.
///
/// ```swift
/// let service = DNSSDService(name: "office-pc", type: "_qxfer._udp", port: 4433, txt: ["fp": "3f9a…"])
/// ```
public struct DNSSDService: Hashable, Sendable {
    /// The instance name people see ("office-pc"): any UTF-8 up to 63 bytes, spaces and dots
    /// included. On a conflict the advertiser renames it "office-pc (2)", "office-pc (3)", …
    public var name: String
    /// The service type, `_name._udp` or `_name._tcp`.
    public var type: String
    /// The domain; multicast DNS serves only `local`.
    public var domain: String
    /// The port the service listens on.
    public var port: UInt16
    /// Attributes sent in the TXT record.
    public var txt: TXTRecord
    /// The host label its addresses are published under (`<label>.local`); nil uses the
    /// machine's host name.
    public var hostName: String?

    /// A service description.
    public init(name: String, type: String, domain: String = "local", port: UInt16, txt: TXTRecord = TXTRecord(), hostName: String? = nil) {
        self.name = name
        self.type = type
        self.domain = domain
        self.port = port
        self.txt = txt
        self.hostName = hostName
    }
}

/// A service instance found by ``NetworkBrowser``: its names, where it listens and its TXT
/// attributes. The attributes are hints from whoever answered; trust comes only from the
/// connection's own verification (pinning, known hosts).
public struct DiscoveredService: Hashable, Sendable, CustomStringConvertible {
    /// The instance name ("office-pc").
    public let name: String
    /// The service type ("_qxfer._udp").
    public let type: String
    /// The domain ("local").
    public let domain: String
    /// The host the service runs on ("office-pc.local").
    public let hostName: String
    /// The port from the SRV record.
    public let port: UInt16
    /// The host's addresses: IPv4 first, then IPv6; link-local IPv6 carry their interface
    /// (`fe80::1%eth0`).
    public let addresses: [String]
    /// The TXT attributes.
    public let txt: TXTRecord

    @_spi(Stacks) public init(name: String, type: String, domain: String, hostName: String, port: UInt16, addresses: [String], txt: TXTRecord) {
        self.name = name
        self.type = type
        self.domain = domain
        self.hostName = hostName
        self.port = port
        self.addresses = addresses
        self.txt = txt
    }

    /// The instance name and where it listens.
    public var description: String {
        "\(name) (\(addresses.first.map { $0.contains(":") ? "[\($0)]" : $0 } ?? hostName):\(port))"
    }
}

extension Endpoint {
    /// The endpoint of a discovered service: its first address (IPv4 preferred, no name
    /// resolution needed) and its port, with the service attached.
    ///
    /// Returns nil when the service has no address yet.
    public static func service(_ service: DiscoveredService) -> Endpoint? {
        guard let address = service.addresses.first else { return nil }
        return Endpoint(host: address, port: service.port, service: service)
    }
}

extension QXferError.Code {
    /// No service of that name (or none at all) answered in time.
    public static let serviceNotFound = QXferError.Code("service-not-found")
    /// Several services answered where exactly one was expected.
    public static let ambiguousService = QXferError.Code("ambiguous-service")
}
