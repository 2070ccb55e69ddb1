@_spi(Stacks) import QXferCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The interfaces multicast DNS can run on, and the sockets it runs on them.
///
/// One socket per interface and address family, each bound to 5353 on the wildcard address
/// with SO_REUSEADDR and SO_REUSEPORT (so avahi-daemon, python-zeroconf and other qxfer
/// processes share the port), tied to its interface with SO_BINDTODEVICE, joined to the group
/// on that interface only, and with IP_MULTICAST_ALL off so it hears nothing another socket
/// of the host joined elsewhere. Knowing the interface of every packet then needs no ancillary
/// data, and every send goes out the interface the machine chose.
enum MDNSSockets {
    /// The interfaces eligible for multicast DNS: up, running, multicast-capable, not loopback,
    /// with at least one address. `names` restricts the choice (and may name loopback).
    static func interfaces(named names: [String]? = nil) -> [MDNSInterface] {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return [] }
        defer { freeifaddrs(list) }
        var found: [String: MDNSInterface] = [:]
        var order: [String] = []
        var cursor: UnsafeMutablePointer<ifaddrs>? = first
        while let entry = cursor {
            defer { cursor = entry.pointee.ifa_next }
            guard let addressPointer = entry.pointee.ifa_addr else { continue }
            let name = String(cString: entry.pointee.ifa_name)
            let flags = Int32(bitPattern: entry.pointee.ifa_flags)
            let up = flags & Int32(IFF_UP) != 0 && flags & Int32(IFF_RUNNING) != 0
            let loopback = flags & Int32(IFF_LOOPBACK) != 0
            let multicast = flags & Int32(IFF_MULTICAST) != 0
            if let names {
                guard names.contains(name), up else { continue }
            } else {
                guard up, multicast, !loopback else { continue }
            }
            let family = Int32(addressPointer.pointee.sa_family)
            var address: [UInt8]
            switch family {
            case AF_INET:
                address = addressPointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { pointer in
                    withUnsafeBytes(of: pointer.pointee.sin_addr) { Array($0) }
                }
            case AF_INET6:
                address = addressPointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                    withUnsafeBytes(of: pointer.pointee.sin6_addr) { Array($0) }
                }
            default:
                continue
            }
            if found[name] == nil {
                let index = Int(if_nametoindex(name))
                guard index > 0 else { continue }
                found[name] = MDNSInterface(index: index, name: name, ipv4: [], ipv6: [])
                order.append(name)
            }
            if family == AF_INET { found[name]!.ipv4.append(address) } else { found[name]!.ipv6.append(address) }
        }
        return order.compactMap { found[$0] }
    }

    /// The indices of interfaces holding an IPv6 address that has finished duplicate address
    /// detection. Sending from an interface whose only address is still tentative fails with
    /// EADDRNOTAVAIL, and NIO closes a datagram channel on that error, so such sends wait.
    static func interfacesWithUsableIPv6() -> Set<Int> {
        guard let handle = fopen("/proc/net/if_inet6", "r") else { return [] }
        defer { fclose(handle) }
        var usable = Set<Int>()
        var line = [CChar](repeating: 0, count: 256)
        while fgets(&line, Int32(line.count), handle) != nil {
            let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let fields = text.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 6, let index = Int(fields[1], radix: 16), let flags = Int(fields[4], radix: 16) else { continue }
            let tentative = 0x40, dadFailed = 0x08
            if flags & (tentative | dadFailed) == 0 { usable.insert(index) }
        }
        return usable
    }

    /// A socket failed to open; the message names the call and errno.
    struct OpenError: Error, CustomStringConvertible {
        let description: String
    }

    /// Opens the IPv4 (`ipv6 == false`) or IPv6 socket for `interface`, bound to port 5353 and
    /// joined to the group. The caller owns the descriptor.
    static func open(on interface: MDNSInterface, ipv6: Bool, port: UInt16 = MDNS.port) throws -> CInt {
        let family = ipv6 ? AF_INET6 : AF_INET
        #if canImport(Glibc)
        let type = Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        #else
        let type = SOCK_DGRAM
        #endif
        let fd = socket(family, type, 0)
        guard fd >= 0 else { throw OpenError(description: "socket: \(String(cString: strerror(errno)))") }
        do {
            try configure(fd, on: interface, ipv6: ipv6, port: port)
            return fd
        } catch {
            close(fd)
            throw error
        }
    }

    private static func configure(_ fd: CInt, on interface: MDNSInterface, ipv6: Bool, port: UInt16) throws {
        func set<T>(_ level: Int32, _ option: Int32, _ value: T, _ what: String) throws {
            let status = withUnsafePointer(to: value) { setsockopt(fd, level, option, $0, socklen_t(MemoryLayout<T>.size)) }
            guard status == 0 else {
                throw OpenError(description: "setsockopt(\(what)) on \(interface.name): \(String(cString: strerror(errno)))")
            }
        }
        let on: Int32 = 1
        try set(SOL_SOCKET, SO_REUSEADDR, on, "SO_REUSEADDR")
        try set(SOL_SOCKET, SO_REUSEPORT, on, "SO_REUSEPORT")
        #if canImport(Glibc)
        var device = Array(interface.name.utf8CString)
        guard setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, &device, socklen_t(device.count)) == 0 else {
            throw OpenError(description: "setsockopt(SO_BINDTODEVICE) on \(interface.name): \(String(cString: strerror(errno)))")
        }
        #endif
        if ipv6 {
            try set(Int32(IPPROTO_IPV6), IPV6_V6ONLY, on, "IPV6_V6ONLY")
            try set(Int32(IPPROTO_IPV6), IPV6_MULTICAST_HOPS, Int32(255), "IPV6_MULTICAST_HOPS")
            try set(Int32(IPPROTO_IPV6), IPV6_UNICAST_HOPS, Int32(255), "IPV6_UNICAST_HOPS")
            try set(Int32(IPPROTO_IPV6), IPV6_MULTICAST_LOOP, UInt32(1), "IPV6_MULTICAST_LOOP")
            try set(Int32(IPPROTO_IPV6), IPV6_MULTICAST_IF, Int32(interface.index), "IPV6_MULTICAST_IF")
            #if canImport(Glibc)
            try? set(Int32(IPPROTO_IPV6), 29 /* IPV6_MULTICAST_ALL */, Int32(0), "IPV6_MULTICAST_ALL")
            #endif
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = port.bigEndian
            try bind(fd, &address, interface: interface.name)
            var request = ipv6_mreq()
            withUnsafeMutableBytes(of: &request.ipv6mr_multiaddr) { $0.copyBytes(from: MDNS.ipv6Group) }
            request.ipv6mr_interface = UInt32(interface.index)
            try set(Int32(IPPROTO_IPV6), IPV6_ADD_MEMBERSHIP, request, "IPV6_ADD_MEMBERSHIP")
        } else {
            try set(Int32(IPPROTO_IP), IP_MULTICAST_TTL, UInt8(255), "IP_MULTICAST_TTL")
            try set(Int32(IPPROTO_IP), IP_TTL, Int32(255), "IP_TTL")
            try set(Int32(IPPROTO_IP), IP_MULTICAST_LOOP, UInt8(1), "IP_MULTICAST_LOOP")
            #if canImport(Glibc)
            try set(Int32(IPPROTO_IP), IP_MULTICAST_ALL, Int32(0), "IP_MULTICAST_ALL")
            var interfaceRequest = ip_mreqn()
            interfaceRequest.imr_ifindex = Int32(interface.index)
            try set(Int32(IPPROTO_IP), IP_MULTICAST_IF, interfaceRequest, "IP_MULTICAST_IF")
            #endif
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            try bind(fd, &address, interface: interface.name)
            #if canImport(Glibc)
            var membership = ip_mreqn()
            withUnsafeMutableBytes(of: &membership.imr_multiaddr) { $0.copyBytes(from: MDNS.ipv4Group) }
            membership.imr_ifindex = Int32(interface.index)
            try set(Int32(IPPROTO_IP), IP_ADD_MEMBERSHIP, membership, "IP_ADD_MEMBERSHIP")
            #endif
        }
    }

    private static func bind<Address>(_ fd: CInt, _ address: inout Address, interface: String) throws {
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(fd, $0, socklen_t(MemoryLayout<Address>.size)) }
        }
        guard result == 0 else {
            throw OpenError(description: "bind to port 5353 on \(interface): \(String(cString: strerror(errno)))")
        }
    }
}
