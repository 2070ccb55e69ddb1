import Foundation
import NIOCore
import Testing
import QXfer
@_spi(Stacks) import QXferCore
@_spi(Stacks) @testable import QXferQUIC

/// The probe a bulk QUIC client runs before its handshake (``PathMTUProbe``): which sizes it
/// tries, and what it learns from a real listener, a closed port and a silent one.
@Suite("QUIC path MTU probe")
struct PathMTUProbeTests {
    @Test func sizesWorthProbing() {
        #expect(PathMTUProbe.candidates(interfaceMTU: 1500, ipv6: false) == [1472])
        #expect(PathMTUProbe.candidates(interfaceMTU: 1500, ipv6: true) == [1452])
        #expect(PathMTUProbe.candidates(interfaceMTU: 9000, ipv6: false) == [8972, 1472])
        #expect(PathMTUProbe.candidates(interfaceMTU: 1492, ipv6: false) == [1464])
        // What ngtcp2's own discovery reaches is not worth a round trip.
        #expect(PathMTUProbe.candidates(interfaceMTU: 1472, ipv6: false) == [])
        #expect(PathMTUProbe.candidates(interfaceMTU: 1280, ipv6: true) == [])
        #expect(PathMTUProbe.candidates(interfaceMTU: 0, ipv6: false) == [])
        #expect(PathMTUProbe.candidates(interfaceMTU: 1 << 20, ipv6: false) == [65_507, 1472])
        #expect(PathMTUProbe.candidates(interfaceMTU: 1 << 20, ipv6: true) == [65_527, 1452])
    }

    /// Up to three probes until one learns `expected`: a probe waits for the larger answers only
    /// ``PathMTUProbe/answerGrace`` past half a round trip, and on a loaded machine (every suite
    /// at once, in a debug build) the listener can be descheduled for longer between answering
    /// the 1 200-byte probe and the largest; the probe then rightly settles for less. What this
    /// checks is that the listener answers the largest size at all.
    static func probeUntil(_ expected: Int, _ remote: SocketAddress, answered: @escaping @Sendable () -> Void) async -> [Int?] {
        var results: [Int?] = []
        for _ in 0..<3 {
            let size = await PathMTUProbe.largestDatagram(to: remote, within: .seconds(5), answered: answered)
            results.append(size)
            if size == expected { break }
        }
        return results
    }

    @Test("A qxfer listener answers; the largest size the loopback interface carries comes back")
    func listenerAnswers() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1", using: .parameters { QUIC().identity(Identities.server) })
        try await withListener(listener, handler: { (_: NetworkConnection<QUIC>) in }) { port in
            let heard = Locked(0)
            // lo's MTU is 65 536: the most an IPv4 datagram holds, 65 507 bytes of UDP payload.
            let sizes = await Self.probeUntil(65_507, try SocketAddress(ipAddress: "127.0.0.1", port: Int(port)),
                                              answered: { heard.withLock { $0 += 1 } })
            #expect(sizes.last == 65_507, "probes learned \(sizes)")
            #expect(heard.withLock { $0 } == sizes.count, "each probe reports the first answer once")
        }
    }

    @Test func listenerAnswersV6() async throws {
        let listener = NetworkListener(on: 0, host: "::1", using: .parameters { QUIC().identity(Identities.server) })
        try await withListener(listener, handler: { (_: NetworkConnection<QUIC>) in }) { port in
            // 65 536 less the IPv6 and UDP headers.
            let sizes = await Self.probeUntil(65_488, try SocketAddress(ipAddress: "::1", port: Int(port)), answered: {})
            #expect(sizes.last == 65_488, "probes learned \(sizes)")
        }
    }

    /// A UDP socket bound to a free loopback port: the descriptor and the port.
    static func boundSocket() throws -> (Int32, Int) {
        let descriptor = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0 }
        }
        try #require(descriptor >= 0 && bound)
        return (descriptor, Int(UInt16(bigEndian: address.sin_port)))
    }

    @Test("A socket that never answers and a closed port: no size, nothing heard")
    func noAnswer() async throws {
        let heard = Locked(false)
        let (silent, silentPort) = try Self.boundSocket()
        defer { close(silent) }
        #expect(await PathMTUProbe.largestDatagram(
            to: try SocketAddress(ipAddress: "127.0.0.1", port: silentPort), within: .milliseconds(300),
            answered: { heard.withLock { $0 = true } }) == nil)
        let (closed, closedPort) = try Self.boundSocket()
        close(closed)  // ICMP port unreachable from now on
        #expect(await PathMTUProbe.largestDatagram(
            to: try SocketAddress(ipAddress: "127.0.0.1", port: closedPort), within: .seconds(5),
            answered: { heard.withLock { $0 = true } }) == nil)
        #expect(!heard.withLock { $0 })
    }

    @Test("A cancelled probe ends without a size (a race another stack won does not wait for it)")
    func cancelled() async throws {
        let (silent, silentPort) = try Self.boundSocket()
        defer { close(silent) }
        let remote = try SocketAddress(ipAddress: "127.0.0.1", port: silentPort)
        let probe = Task { await PathMTUProbe.largestDatagram(to: remote, within: .seconds(5), answered: {}) }
        try await Task.sleep(for: .milliseconds(50))
        probe.cancel()
        #expect(await probe.value == nil)
    }
}

#if canImport(Glibc)
import Glibc
#endif
