#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
internal import CNGTCP2

/// An IPv4 or IPv6 address and UDP port, with no dependency on NIO.
///
/// Converts to and from the bytes of a `sockaddr_in` / `sockaddr_in6`, which is what
/// ngtcp2's `ngtcp2_addr` points at.
public struct QUICSocketAddress: Hashable, Sendable, CustomStringConvertible {
    /// The address bytes in network order (4 for IPv4, 16 for IPv6), kept inline: paths are
    /// built and compared for every packet sent and every datagram read.
    private let address: InlineBytes
    /// The UDP port.
    public let port: UInt16
    /// The IPv6 scope (interface index) for link-local addresses; 0 otherwise.
    public let scopeID: UInt32

    /// The address bytes in network order: 4 for IPv4, 16 for IPv6.
    public var addressBytes: [UInt8] { address.array }

    /// Whether this is an IPv6 address.
    public var isIPv6: Bool { address.count == 16 }

    /// Whether this is a loopback address: 127.0.0.0/8, ::1, or ::ffff:127.0.0.0/104.
    public var isLoopback: Bool {
        let addressBytes = self.addressBytes
        if addressBytes.count == 4 { return addressBytes[0] == 127 }
        if addressBytes == [UInt8](repeating: 0, count: 15) + [1] { return true }
        return addressBytes.prefix(12) == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] && addressBytes[12] == 127
    }

    /// Creates an address from raw bytes (4 → IPv4, 16 → IPv6); nil for any other length.
    public init?(addressBytes: [UInt8], port: UInt16, scopeID: UInt32 = 0) {
        guard let address = addressBytes.withUnsafeBytes(InlineBytes.init) else { return nil }
        self.init(address, port: port, scopeID: scopeID)
    }

    private init?(_ address: InlineBytes, port: UInt16, scopeID: UInt32 = 0) {
        guard address.count == 4 || address.count == 16 else { return nil }
        self.address = address
        self.port = port
        self.scopeID = address.count == 16 ? scopeID : 0
    }

    /// Parses a numeric IPv4 (`"192.0.2.1"`) or IPv6 (`"2001:db8::1"`) address; nil if it is neither.
    public init?(ipAddress: String, port: UInt16) {
        var v4 = in_addr()
        if inet_pton(AF_INET, ipAddress, &v4) == 1 {
            let bytes = withUnsafeBytes(of: &v4) { Array($0) }
            self.init(addressBytes: bytes, port: port)
            return
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, ipAddress, &v6) == 1 {
            let bytes = withUnsafeBytes(of: &v6) { Array($0) }
            self.init(addressBytes: bytes, port: port)
            return
        }
        return nil
    }

    /// Reads the bytes of a `sockaddr_in` or `sockaddr_in6` (e.g. from a `sockaddr_storage`);
    /// nil for other families or short lengths.
    public init?(sockaddrBytes bytes: UnsafeRawBufferPointer) {
        guard bytes.count >= MemoryLayout<sa_family_t>.size, let base = bytes.baseAddress else { return nil }
        switch Int32(base.loadUnaligned(as: sa_family_t.self)) {
        case AF_INET:
            guard bytes.count >= MemoryLayout<sockaddr_in>.size else { return nil }
            let sin = base.loadUnaligned(as: sockaddr_in.self)
            guard let address = withUnsafeBytes(of: sin.sin_addr, InlineBytes.init) else { return nil }
            self.init(address, port: UInt16(bigEndian: sin.sin_port))
        case AF_INET6:
            guard bytes.count >= MemoryLayout<sockaddr_in6>.size else { return nil }
            let sin6 = base.loadUnaligned(as: sockaddr_in6.self)
            guard let address = withUnsafeBytes(of: sin6.sin6_addr, InlineBytes.init) else { return nil }
            self.init(address, port: UInt16(bigEndian: sin6.sin6_port), scopeID: sin6.sin6_scope_id)
        default:
            return nil
        }
    }

    /// Calls `body` with this address encoded as a `sockaddr_in` or `sockaddr_in6`
    /// (exactly that many bytes), ready to copy into a `sockaddr_storage`.
    public func withSockaddrBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        var storage = sockaddr_storage()
        return try withUnsafeMutableBytes(of: &storage) { raw in
            let length = self.write(into: raw.baseAddress!)
            return try body(UnsafeRawBufferPointer(rebasing: raw[..<length]))
        }
    }

    /// Writes the sockaddr form into `destination` (at least `sockaddr_storage` bytes); returns its length.
    @discardableResult
    func write(into destination: UnsafeMutableRawPointer) -> Int {
        if isIPv6 {
            var sin6 = sockaddr_in6()
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            sin6.sin6_scope_id = scopeID
            withUnsafeMutableBytes(of: &sin6.sin6_addr) { target in address.withUnsafeBytes { target.copyMemory(from: $0) } }
            destination.storeBytes(of: sin6, as: sockaddr_in6.self)
            return MemoryLayout<sockaddr_in6>.size
        } else {
            var sin = sockaddr_in()
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = port.bigEndian
            withUnsafeMutableBytes(of: &sin.sin_addr) { target in address.withUnsafeBytes { target.copyMemory(from: $0) } }
            destination.storeBytes(of: sin, as: sockaddr_in.self)
            return MemoryLayout<sockaddr_in>.size
        }
    }

    init?(_ addr: ngtcp2_addr) {
        guard let p = addr.addr else { return nil }
        self.init(sockaddrBytes: UnsafeRawBufferPointer(start: UnsafeRawPointer(p), count: Int(addr.addrlen)))
    }

    public var description: String {
        if isIPv6 {
            var groups: [String] = []
            for i in stride(from: 0, to: 16, by: 2) {
                groups.append(String(UInt16(addressBytes[i]) << 8 | UInt16(addressBytes[i + 1]), radix: 16))
            }
            return "[\(groups.joined(separator: ":"))]:\(port)"
        }
        return addressBytes.map(String.init).joined(separator: ".") + ":\(port)"
    }
}

/// The pair of addresses a datagram travels between, from this endpoint's view
/// (ngtcp2's `ngtcp2_path`).
public struct QUICPath: Hashable, Sendable, CustomStringConvertible {
    /// This endpoint's address (the socket's bound address, or the destination of a received datagram).
    public var local: QUICSocketAddress
    /// The peer's address.
    public var remote: QUICSocketAddress

    /// Creates a path.
    public init(local: QUICSocketAddress, remote: QUICSocketAddress) {
        self.local = local
        self.remote = remote
    }

    public var description: String { "\(local)<->\(remote)" }

    /// Calls `body` with an `ngtcp2_path` whose addresses live on the stack for the call.
    func withNGTCP2Path<R>(_ body: (UnsafePointer<ngtcp2_path>) throws -> R) rethrows -> R {
        var localStorage = sockaddr_storage()
        var remoteStorage = sockaddr_storage()
        return try withUnsafeMutableBytes(of: &localStorage) { lraw in
            try withUnsafeMutableBytes(of: &remoteStorage) { rraw in
                let llen = local.write(into: lraw.baseAddress!)
                let rlen = remote.write(into: rraw.baseAddress!)
                var path = ngtcp2_path(
                    local: ngtcp2_addr(addr: lraw.baseAddress!.assumingMemoryBound(to: ngtcp2_sockaddr.self),
                                       addrlen: ngtcp2_socklen(llen)),
                    remote: ngtcp2_addr(addr: rraw.baseAddress!.assumingMemoryBound(to: ngtcp2_sockaddr.self),
                                        addrlen: ngtcp2_socklen(rlen)),
                    user_data: nil)
                return try body(&path)
            }
        }
    }

    init?(_ path: ngtcp2_path) {
        guard let local = QUICSocketAddress(path.local), let remote = QUICSocketAddress(path.remote) else { return nil }
        self.init(local: local, remote: remote)
    }
}

/// Explicit Congestion Notification codepoint of a datagram (the IP header's two ECN bits).
public struct QUICECN: Hashable, Sendable {
    /// The two-bit codepoint: 0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE.
    public let rawValue: UInt8
    /// Creates a codepoint from the low two bits of `rawValue`.
    public init(rawValue: UInt8) { self.rawValue = rawValue & 0x3 }
    /// Not ECN-capable.
    public static let notECT = QUICECN(rawValue: 0)
    /// ECN-capable, ECT(1).
    public static let ect1 = QUICECN(rawValue: 1)
    /// ECN-capable, ECT(0).
    public static let ect0 = QUICECN(rawValue: 2)
    /// Congestion experienced.
    public static let congestionExperienced = QUICECN(rawValue: 3)
}

/// A QUIC connection ID (0 to 20 bytes), as carried in packet headers (ngtcp2's `ngtcp2_cid`).
public struct QUICConnectionID: Hashable, Sendable, CustomStringConvertible {
    /// Kept inline: the listener looks one up for every datagram it reads.
    private let storage: InlineBytes

    /// The ID's bytes.
    public var bytes: [UInt8] { storage.array }

    /// The ID's length in bytes.
    public var count: Int { storage.count }

    /// Creates a connection ID; nil if longer than 20 bytes (`NGTCP2_MAX_CIDLEN`).
    public init?(_ bytes: [UInt8]) {
        guard let storage = bytes.withUnsafeBytes(InlineBytes.init) else { return nil }
        self.storage = storage
    }

    init(_ cid: ngtcp2_cid) {
        let length = min(cid.datalen, Int(NGTCP2_MAX_CIDLEN))
        storage = withUnsafeBytes(of: cid.data) { InlineBytes(UnsafeRawBufferPointer(rebasing: $0.prefix(length))) } ?? InlineBytes()
    }

    init(pointer: UnsafePointer<UInt8>?, length: Int) {
        if let pointer, length > 0 {
            storage = InlineBytes(UnsafeRawBufferPointer(start: pointer, count: min(length, Int(NGTCP2_MAX_CIDLEN)))) ?? InlineBytes()
        } else {
            storage = InlineBytes()
        }
    }

    /// Whether the ID begins with `prefix`.
    public func starts(with prefix: [UInt8]) -> Bool {
        storage.withUnsafeBytes { $0.starts(with: prefix) }
    }

    var ngtcp2CID: ngtcp2_cid {
        var cid = ngtcp2_cid()
        storage.withUnsafeBytes { ngtcp2_cid_init(&cid, $0.baseAddress?.assumingMemoryBound(to: UInt8.self), $0.count) }
        return cid
    }

    public var description: String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }
}

/// Up to 20 bytes (a connection ID, an IPv6 address) stored in the value itself, so building,
/// hashing and comparing one allocates nothing: the engine and the listener do that for every
/// packet, where an array each time cost an allocation, a free and a byte-by-byte hash.
struct InlineBytes: Hashable, Sendable {
    static let capacity = 20
    private var words: (UInt64, UInt64, UInt32) = (0, 0, 0)
    private(set) var count = 0

    /// No bytes.
    init() {}

    /// A copy of `bytes`; nil if they are more than ``capacity``.
    init?(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count <= Self.capacity else { return nil }
        count = bytes.count
        if let base = bytes.baseAddress, !bytes.isEmpty {
            Swift.withUnsafeMutableBytes(of: &words) { $0.baseAddress!.copyMemory(from: base, byteCount: bytes.count) }
        }
    }

    func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
        try Swift.withUnsafeBytes(of: words) { try body(UnsafeRawBufferPointer(rebasing: $0[..<count])) }
    }

    var array: [UInt8] { withUnsafeBytes { Array($0) } }

    static func == (left: InlineBytes, right: InlineBytes) -> Bool {
        left.count == right.count && left.words.0 == right.words.0 && left.words.1 == right.words.1 && left.words.2 == right.words.2
    }

    func hash(into hasher: inout Hasher) {
        hasher.combine(words.0)
        hasher.combine(words.1)
        hasher.combine(words.2)
        hasher.combine(count)
    }
}
