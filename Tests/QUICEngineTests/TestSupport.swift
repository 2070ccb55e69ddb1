import CNGTCP2
import QUICEngine
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// xoshiro256** seeded through splitmix64: small, fast, reproducible.
struct TestRNG {
    private var s: (UInt64, UInt64, UInt64, UInt64)

    init(seed: UInt64) {
        var x = seed
        func splitmix() -> UInt64 {
            x &+= 0x9E37_79B9_7F4A_7C15
            var z = x
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        s = (splitmix(), splitmix(), splitmix(), splitmix())
    }

    mutating func next() -> UInt64 {
        let result = ((s.1 &* 5) << 7 | (s.1 &* 5) >> 57) &* 9
        let t = s.1 << 17
        s.2 ^= s.0
        s.3 ^= s.1
        s.1 ^= s.2
        s.0 ^= s.3
        s.2 ^= t
        s.3 = s.3 << 45 | s.3 >> 19
        return result
    }

    /// Uniform in [0, 1).
    mutating func unit() -> Double { Double(next() >> 11) * 0x1.0p-53 }

    /// Uniform in 0..<bound.
    mutating func below(_ bound: UInt64) -> UInt64 { bound == 0 ? 0 : next() % bound }

    mutating func chance(_ p: Double) -> Bool { p > 0 && unit() < p }

    mutating func bytes(_ count: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var i = 0
        while i < count {
            var v = next()
            for _ in 0..<8 where i < count {
                out[i] = UInt8(truncatingIfNeeded: v)
                v >>= 8
                i += 1
            }
        }
        return out
    }
}

/// A P-256 key and self-signed certificate made through GnuTLS in the CNGTCP2 shim.
struct TestIdentity: Sendable {
    let certificatePEM: String
    let privateKeyPEM: String
    let leafDER: [UInt8]

    static let server = TestIdentity.generate(commonName: "qxfer-test-server")
    static let client = TestIdentity.generate(commonName: "qxfer-test-client")

    static func generate(commonName: String) -> TestIdentity {
        var cert = gnutls_datum_t()
        var key = gnutls_datum_t()
        let rv = cngtcp2_generate_self_signed_p256(commonName, 30, &cert, &key)
        precondition(rv == 0, "certificate generation failed: \(rv)")
        defer {
            cngtcp2_gnutls_free(cert.data)
            cngtcp2_gnutls_free(key.data)
        }
        let certPEM = String(decoding: UnsafeBufferPointer(start: cert.data, count: Int(cert.size)), as: UTF8.self)
        let keyPEM = String(decoding: UnsafeBufferPointer(start: key.data, count: Int(key.size)), as: UTF8.self)
        return TestIdentity(certificatePEM: certPEM, privateKeyPEM: keyPEM, leafDER: pemToDER(certPEM))
    }

    /// Base64-decodes the first PEM block.
    static func pemToDER(_ pem: String) -> [UInt8] {
        let body = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        var datum = Array(body.utf8)
        var out = gnutls_datum_t()
        let rv = datum.withUnsafeMutableBufferPointer { b -> Int32 in
            var input = gnutls_datum_t(data: b.baseAddress, size: UInt32(b.count))
            return gnutls_base64_decode2(&input, &out)
        }
        precondition(rv == 0)
        defer { cngtcp2_gnutls_free(out.data) }
        return Array(UnsafeBufferPointer(start: out.data, count: Int(out.size)))
    }
}

extension QUICConfiguration {
    /// A configuration that pins the other test identity's exact leaf certificate.
    static func test(_ identity: TestIdentity, expectPeer peer: TestIdentity?) -> QUICConfiguration {
        let expected = peer?.leafDER
        var config = QUICConfiguration(certificateChainPEM: identity.certificatePEM, privateKeyPEM: identity.privateKeyPEM,
                                       verifyPeer: { leaf in expected == nil || leaf == expected! })
        config.initialRTT = .milliseconds(50)
        return config
    }
}

let ms: UInt64 = 1_000_000

/// Conditions of one direction of the simulated link.
struct LinkConditions {
    var delay: UInt64 = 10 * ms
    /// Extra random delay in 0..<jitter; values larger than the packet spacing reorder packets
    /// unless `jitterKeepsOrder`.
    var jitter: UInt64 = 0
    /// A packet never arrives before the one sent ahead of it (as qxfer-linkemu's jitter): a
    /// busy flow's packets then take close to the largest delay, a packet after a pause the
    /// drawn one.
    var jitterKeepsOrder = false
    var loss: Double = 0
    var duplication: Double = 0
    /// Bits per second; 0 means unlimited.
    var rate: UInt64 = 0
    /// Tail-drop when the queue would delay a packet more than this.
    var maxQueueDelay: UInt64 = 100 * ms
    var mtu: Int = 1500
}

enum Side: Hashable, CustomStringConvertible {
    case client, server
    var description: String { self == .client ? "client" : "server" }
}

/// A deterministic discrete-event simulation of a client and a server engine joined by a
/// lossy, delaying, reordering, duplicating, rate-limited link. Events are ordered by
/// (time, sequence); all randomness comes from one seeded RNG.
final class Simulation {
    struct Flight: Comparable {
        let time: UInt64
        let sequence: UInt64
        let to: Side
        let datagram: [UInt8]
        /// Source and destination as seen on the wire.
        let source: QUICSocketAddress
        let destination: QUICSocketAddress
        static func < (a: Flight, b: Flight) -> Bool { (a.time, a.sequence) < (b.time, b.sequence) }
        static func == (a: Flight, b: Flight) -> Bool { a.time == b.time && a.sequence == b.sequence }
    }

    let seed: UInt64
    var rng: TestRNG
    private(set) var now: UInt64 = 1_000_000_000
    private var sequence: UInt64 = 0
    private var heap: [Flight] = []
    var up = LinkConditions()     // client → server
    var down = LinkConditions()   // server → client
    private var linkFree: [Side: UInt64] = [.client: 0, .server: 0]
    /// When the last packet each side sent arrives (for `jitterKeepsOrder`).
    private var lastArrival: [Side: UInt64] = [.client: 0, .server: 0]

    let serverAddress: QUICSocketAddress
    private(set) var clientAddress: QUICSocketAddress
    /// Client local address → address the server sees (a NAT); identity when absent.
    var natOutbound: [QUICSocketAddress: QUICSocketAddress] = [:]
    private var natInbound: [QUICSocketAddress: QUICSocketAddress] = [:]

    let client: QUICConnection
    var server: QUICConnection?
    let serverConfiguration: QUICConfiguration

    var clientEvents: [QUICEvent] = []
    var serverEvents: [QUICEvent] = []
    /// Called for each event as it is polled.
    var onEvent: ((Side, QUICEvent) -> Void)?
    /// Wake the application at least this often (virtual nanoseconds).
    var tick: UInt64?
    /// Called after every step, to let the test's "application" read and write.
    var onStep: (() -> Void)?
    /// Called for each batch a side sends, with the virtual time it left (before the link's effects).
    var onTransmit: ((Side, QUICTransmit) -> Void)?
    /// Drops datagrams for which this returns true (after the random link effects).
    var filter: ((Side, [UInt8]) -> Bool)?
    private(set) var delivered: [Side: Int] = [.client: 0, .server: 0]
    private(set) var dropped: [Side: Int] = [.client: 0, .server: 0]
    var serverErrors: [QUICEngineError] = []
    /// The server validates the client's address with a Retry before accepting (RFC 9000 §8.1.2).
    var requireRetry = false
    /// Retry packets the server sent, and whether the connection it accepted came through one.
    private(set) var retriesSent = 0
    private(set) var acceptedAfterRetry = false
    let retrySecret = (0..<32).map { _ in UInt8.random(in: 0...255) }
    /// The largest GSO batch seen.
    private(set) var maxSegmentCount = 0
    /// The largest datagram, and the most bytes in a batch of several, that either side sent.
    private(set) var maxDatagramSize = 0
    private(set) var maxBatchBytes = 0

    /// With `loopback`, the two ends have addresses 127.0.0.2 and 127.0.0.1 instead of 10.0.0.x.
    init(seed: UInt64, client clientConfiguration: QUICConfiguration, server serverConfiguration: QUICConfiguration,
         loopback: Bool = false) throws {
        serverAddress = QUICSocketAddress(ipAddress: loopback ? "127.0.0.1" : "10.0.0.1", port: 4433)!
        clientAddress = QUICSocketAddress(ipAddress: loopback ? "127.0.0.2" : "10.0.0.2", port: 50000)!
        self.seed = seed
        self.rng = TestRNG(seed: seed)
        self.serverConfiguration = serverConfiguration
        client = try QUICConnection(clientWith: clientConfiguration,
                                    path: QUICPath(local: clientAddress, remote: serverAddress),
                                    now: QUICTime(nanoseconds: now))
    }

    var nowTime: QUICTime { QUICTime(nanoseconds: now) }

    func connection(_ side: Side) -> QUICConnection? { side == .client ? client : server }

    /// The client's NAT changes its public port: NAT rebinding as the server sees it.
    func rebindClientNAT(toPort port: UInt16) {
        let external = QUICSocketAddress(ipAddress: "192.0.2.7", port: port)!
        natOutbound[clientAddress] = external
        natInbound[external] = clientAddress
    }

    /// The client moves to a new local address (a new interface or socket).
    func migrateClient(toPort port: UInt16) throws {
        let newLocal = QUICSocketAddress(ipAddress: "10.0.1.2", port: port)!
        try client.migrate(toLocalAddress: newLocal, now: nowTime)
        clientAddress = newLocal
    }

    /// Injects a raw datagram towards `side` now, as if from `source`.
    func inject(_ datagram: [UInt8], to side: Side, from source: QUICSocketAddress? = nil) {
        let destination = side == .server ? serverAddress : clientAddress
        let src = source ?? (side == .server ? clientAddress : serverAddress)
        push(Flight(time: now, sequence: nextSequence(), to: side, datagram: datagram, source: src, destination: destination))
    }

    private func nextSequence() -> UInt64 {
        sequence += 1
        return sequence
    }

    // Binary heap on (time, sequence).
    private func push(_ f: Flight) {
        heap.append(f)
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            if heap[i] < heap[parent] { heap.swapAt(i, parent); i = parent } else { break }
        }
    }

    private func pop() -> Flight? {
        guard !heap.isEmpty else { return nil }
        heap.swapAt(0, heap.count - 1)
        let top = heap.removeLast()
        var i = 0
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < heap.count && heap[l] < heap[m] { m = l }
            if r < heap.count && heap[r] < heap[m] { m = r }
            if m == i { break }
            heap.swapAt(i, m)
            i = m
        }
        return top
    }

    private func send(_ transmit: QUICTransmit, from side: Side) {
        let conditions = side == .client ? up : down
        let to: Side = side == .client ? .server : .client
        let source = side == .client ? (natOutbound[transmit.path.local] ?? transmit.path.local) : transmit.path.local
        let destination = transmit.path.remote
        // GSO batch invariants: equal segments, the last possibly shorter.
        let segments = transmit.segments
        precondition(segments.count == transmit.segmentCount && transmit.segmentCount >= 1)
        precondition(segments.dropLast().allSatisfy { $0.count == transmit.segmentSize })
        precondition(segments.last!.count <= transmit.segmentSize)
        maxSegmentCount = max(maxSegmentCount, transmit.segmentCount)
        maxDatagramSize = max(maxDatagramSize, transmit.segmentSize)
        if transmit.segmentCount > 1 { maxBatchBytes = max(maxBatchBytes, transmit.data.count) }
        for segment in transmit.segments {
            let datagram = Array(segment)
            if datagram.count > conditions.mtu || rng.chance(conditions.loss) {
                dropped[to, default: 0] += 1
                continue
            }
            var departure = now
            if conditions.rate > 0 {
                let start = max(now, linkFree[side]!)
                if start - now > conditions.maxQueueDelay {
                    dropped[to, default: 0] += 1
                    continue
                }
                let serialization = UInt64(datagram.count) * 8 * 1_000_000_000 / conditions.rate
                linkFree[side] = start + serialization
                departure = start + serialization
            }
            var copies = 1
            if rng.chance(conditions.duplication) { copies = 2 }
            for _ in 0..<copies {
                let jitter = conditions.jitter > 0 ? rng.below(conditions.jitter) : 0
                var arrival = departure + conditions.delay + jitter
                if conditions.jitterKeepsOrder {
                    arrival = max(arrival, lastArrival[side]!)
                    lastArrival[side] = arrival
                }
                push(Flight(time: arrival, sequence: nextSequence(), to: to,
                            datagram: datagram, source: source, destination: destination))
            }
        }
    }

    private func flush() {
        for side in [Side.client, .server] {
            guard let c = connection(side) else { continue }
            var batches = 0
            while let t = c.pollTransmit(now: nowTime) {
                onTransmit?(side, t)
                send(t, from: side)
                batches += 1
                precondition(batches < 100_000, "pollTransmit never returns nil (seed \(seed))")
            }
            while let e = c.pollEvent() {
                if side == .client { clientEvents.append(e) } else { serverEvents.append(e) }
                onEvent?(side, e)
            }
        }
    }

    private func deliver(_ f: Flight) {
        if let filter, filter(f.to, f.datagram) {
            dropped[f.to, default: 0] += 1
            return
        }
        delivered[f.to, default: 0] += 1
        switch f.to {
        case .server:
            if server == nil {
                guard case .supported = QUICPacketHeader.decode(datagram: f.datagram,
                                                                shortHeaderConnectionIDLength: serverConfiguration.connectionIDLength),
                      let initial = QUICInitialPacket.accept(datagram: f.datagram) else { return }
                let original = QUICRetry.validate(initial, remote: f.source, secret: retrySecret, now: nowTime)
                if requireRetry && original == nil {
                    let retryID = QUICConnectionID((0..<serverConfiguration.connectionIDLength).map { _ in UInt8.random(in: 0...255) })!
                    if let retry = QUICRetry.write(for: initial, remote: f.source, secret: retrySecret, retryConnectionID: retryID, now: nowTime) {
                        retriesSent += 1
                        push(Flight(time: now, sequence: nextSequence(), to: .client, datagram: retry, source: serverAddress, destination: f.source))
                    }
                    return
                }
                acceptedAfterRetry = original != nil
                do {
                    server = try QUICConnection(serverWith: serverConfiguration, initialPacket: initial,
                                                path: QUICPath(local: serverAddress, remote: f.source), now: nowTime, retriedFrom: original)
                } catch {
                    serverErrors.append(error)
                    return
                }
            }
            do {
                try server!.handle(datagram: f.datagram, path: QUICPath(local: f.destination, remote: f.source), now: nowTime)
            } catch {
                serverErrors.append(error)
            }
        case .client:
            let local = natInbound[f.destination] ?? f.destination
            try? client.handle(datagram: f.datagram, path: QUICPath(local: local, remote: f.source), now: nowTime)
        }
    }

    /// Runs until `condition` holds (checked after each step) or virtual `timeLimit` passes.
    /// Returns whether the condition was met.
    @discardableResult
    func run(for timeLimit: UInt64, until condition: () -> Bool) -> Bool {
        let end = now + timeLimit
        var stepsAtSameTime = 0
        var lastTime = now
        while true {
            flush()
            onStep?()
            flush()
            if condition() { return true }
            var next = heap.first?.time ?? .max
            for side in [Side.client, .server] {
                if let t = connection(side)?.nextTimeout?.nanoseconds { next = min(next, t) }
            }
            if let tick { next = min(next, now + tick) }
            if next == .max || next > end { now = max(now, min(end, next == .max ? end : next)); return condition() }
            now = max(now, next)
            if now == lastTime {
                stepsAtSameTime += 1
                if stepsAtSameTime >= 100_000 {
                    preconditionFailure("simulation stuck at \(now) (seed \(seed)): client timeout \(String(describing: client.nextTimeout)), server timeout \(String(describing: server?.nextTimeout)), next flight \(String(describing: heap.first?.time)), client \(client.stats), closed \(client.isClosed)")
                }
            } else {
                stepsAtSameTime = 0
                lastTime = now
            }
            while let top = heap.first, top.time <= now {
                _ = pop()
                deliver(top)
            }
            for side in [Side.client, .server] {
                if let c = connection(side), let t = c.nextTimeout, t.nanoseconds <= now {
                    c.handleTimeout(now: nowTime)
                }
            }
        }
    }

    /// Runs until both sides report the handshake (or either closes).
    @discardableResult
    func runHandshake(timeLimit: UInt64 = 5_000 * ms) -> Bool {
        run(for: timeLimit) { client.isHandshakeComplete && (server?.isHandshakeComplete ?? false) || client.isClosed }
    }

    func closeReason(_ side: Side) -> QUICCloseReason? {
        for e in side == .client ? clientEvents : serverEvents {
            if case .connectionClosed(let r) = e { return r }
        }
        return nil
    }
}

/// A deterministic byte pattern of arbitrary length, compared with memcmp.
struct Pattern {
    let bytes: [UInt8]
    init(seed: UInt64) {
        var rng = TestRNG(seed: seed ^ 0x5EED)
        bytes = rng.bytes(1_048_573) // prime-ish, so chunk boundaries do not line up
    }

    /// Calls `body` with the pattern bytes at `offset` (at most `maxLength`, maybe fewer at wrap-around).
    func withBytes<R>(at offset: Int, maxLength: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        let start = offset % bytes.count
        let n = min(maxLength, bytes.count - start)
        return bytes.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[start..<start + n])) }
    }

    /// Whether `received` equals the pattern at `offset`.
    func matches(_ received: [UInt8], at offset: Int) -> Bool {
        var checked = 0
        while checked < received.count {
            let ok: Bool = withBytes(at: offset + checked, maxLength: received.count - checked) { expected in
                received.withUnsafeBytes { r in
                    memcmp(r.baseAddress! + checked, expected.baseAddress!, expected.count) == 0
                }
            }
            if !ok { return false }
            checked += min(received.count - checked, bytes.count - (offset + checked) % bytes.count)
        }
        return true
    }
}
