import Foundation
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

#if canImport(Glibc)
import Glibc
#endif

/// The service class of QUIC connections reaches the wire: every datagram carries its DSCP in
/// the IP header's traffic-class byte, as read by a receiving socket (IP_RECVTOS).
@Suite("QUIC service class on the wire")
struct QUICServiceClassTests {
    @Test("A QUIC client's datagrams carry the DSCP of its service class", .timeLimit(.minutes(2)), arguments: [
        ServiceClass.interactiveVideo, .interactiveVoice, .bulkData, .bestEffort,
    ])
    func dscpOnTheWire(_ serviceClass: ServiceClass) async throws {
        let trap = try TOSReceivingSocket()
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: trap.port), using: .parameters {
            QUIC().identity(Identities.client).peerFingerprint(Identities.server.fingerprint)
        }.serviceClass(serviceClass))
        let attempt = Task { try? await connection.start() }
        defer {
            connection.cancel()
            attempt.cancel()
        }
        // Generous: the flood tests running beside this one keep both event loops busy for seconds.
        let received = try #require(await trap.receive(within: .seconds(45)), "the client sent nothing")
        #expect(received.bytes[0] & 0xf0 == 0xc0, "a long-header Initial")
        #expect(received.trafficClass >> 2 == Int(serviceClass.dscp),
                "DSCP \(received.trafficClass >> 2), expected \(serviceClass.dscp) for \(serviceClass)")
    }
}

/// A UDP socket on 127.0.0.1 that reports each datagram's IP traffic-class byte.
final class TOSReceivingSocket: @unchecked Sendable {
    // One test task uses it; the descriptor never changes.
    let fd: Int32
    let port: UInt16

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { throw QXferError(.bindFailed, "socket: errno \(errno)") }
        var on: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_IP), IP_RECVTOS, &on, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard ok else {
            close(fd)
            throw QXferError(.bindFailed, "bind: errno \(errno)")
        }
        self.fd = fd
        port = UInt16(bigEndian: address.sin_port)
    }

    deinit { close(fd) }

    /// The next datagram and its traffic-class byte, or nil after `timeout`; polls without
    /// holding a thread of the cooperative pool.
    func receive(within timeout: Duration) async -> (bytes: [UInt8], trafficClass: Int)? {
        let deadline = ContinuousClock.now + timeout
        repeat {
            if let datagram = receiveNow() { return datagram }
            try? await Task.sleep(for: .milliseconds(5))
        } while ContinuousClock.now < deadline
        return nil
    }

    private func receiveNow() -> (bytes: [UInt8], trafficClass: Int)? {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        var controlSpace = [UInt8](repeating: 0, count: 256)
        var control: [UInt8] = []
        let count = buffer.withUnsafeMutableBytes { data in
            controlSpace.withUnsafeMutableBytes { controlBytes in
                var vector = iovec(iov_base: data.baseAddress, iov_len: data.count)
                return withUnsafeMutablePointer(to: &vector) { vectorPointer in
                    var message = msghdr()
                    message.msg_iov = vectorPointer
                    message.msg_iovlen = 1
                    message.msg_control = controlBytes.baseAddress
                    message.msg_controllen = controlBytes.count
                    let n = recvmsg(fd, &message, Int32(MSG_DONTWAIT))
                    control = Array(controlBytes.prefix(Int(message.msg_controllen)))
                    return n
                }
            }
        }
        guard count >= 0 else { return nil }
        // Control messages: cmsghdr (length: size_t, level: Int32, type: Int32), then the data,
        // each aligned to 8 bytes on Linux x86_64 and arm64.
        var offset = 0
        var trafficClass = -1
        while offset + 16 <= control.count {
            let length = control[offset..<offset + 8].withUnsafeBytes { $0.loadUnaligned(as: Int.self) }
            let level = control[offset + 8..<offset + 12].withUnsafeBytes { $0.loadUnaligned(as: Int32.self) }
            let type = control[offset + 12..<offset + 16].withUnsafeBytes { $0.loadUnaligned(as: Int32.self) }
            guard length >= 16 else { break }
            if level == Int32(IPPROTO_IP) && type == IP_TOS && offset + 16 < control.count {
                trafficClass = Int(control[offset + 16])
            }
            offset += (length + 7) & ~7
        }
        return (Array(buffer.prefix(count)), trafficClass)
    }
}
