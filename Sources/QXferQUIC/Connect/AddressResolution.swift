import NIOCore
import NIOPosix
@_spi(Stacks) import QXferCore

extension QUICConnector {
    /// Resolves a host name into addresses ordered for racing: IPv6 and IPv4 alternating,
    /// IPv6 first (RFC 8305 section 4).
    static func resolve(_ endpoint: Endpoint) async throws -> [SocketAddress] {
        let host = endpoint.host
        let port = Int(endpoint.port)
        if let literal = try? SocketAddress(ipAddress: host, port: port) { return [literal] }
        let found: [SocketAddress] = try await NIOThreadPool.singleton.runIfActive {
            var hints = addrinfo()
            hints.ai_socktype = Int32(SOCK_DGRAM.rawValue)
            var list: UnsafeMutablePointer<addrinfo>?
            let status = getaddrinfo(host, String(port), &hints, &list)
            guard status == 0, let list else {
                throw QXferError(.connectFailed, "cannot resolve \(host): \(String(cString: gai_strerror(status)))", underlying: NameDoesNotResolve(host: host))
            }
            defer { freeaddrinfo(list) }
            var addresses: [SocketAddress] = []
            var cursor: UnsafeMutablePointer<addrinfo>? = list
            while let entry = cursor {
                if let address = entry.pointee.ai_addr {
                    switch entry.pointee.ai_family {
                    case AF_INET:
                        address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { addresses.append(SocketAddress($0.pointee, host: host)) }
                    case AF_INET6:
                        address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { addresses.append(SocketAddress($0.pointee, host: host)) }
                    default: break
                    }
                }
                cursor = entry.pointee.ai_next
            }
            return addresses
        }
        var v6 = found.filter { $0.protocol == .inet6 }.makeIterator()
        var v4 = found.filter { $0.protocol == .inet }.makeIterator()
        var ordered: [SocketAddress] = []
        while true {
            let a = v6.next(), b = v4.next()
            if a == nil && b == nil { break }
            if let a, !ordered.contains(a) { ordered.append(a) }
            if let b, !ordered.contains(b) { ordered.append(b) }
        }
        guard !ordered.isEmpty else { throw QXferError(.connectFailed, "\(host) has no address") }
        return ordered
    }
}

#if canImport(Glibc)
import Glibc
#endif
