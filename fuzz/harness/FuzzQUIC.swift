// libFuzzer target: the QUIC listener's datagram input, before and after the handshake — what
// reaches a `qxfer recv` UDP port from anyone (Sources/QUICEngine: QUICPacketHeader.decode,
// QUICVersionNegotiation, QUICPathProbe.isAnswered, QUICInitialPacket.accept, QUICRetry.validate and a server
// QUICConnection's handle/pollTransmit/pollEvent/handleTimeout, over ngtcp2 and GnuTLS).
//
// Input: byte 0 picks the mode; the rest is datagrams, each a u16 length and its bytes.
//  0  before the handshake: each datagram reaches the listener from a new address and takes the
//     listener's route (QUICSocketHandler): decoded header → Version Negotiation for unknown
//     versions → Retry-token check → if it is an acceptable Initial, a server connection made
//     from it that then gets the datagram and the ones after, with its output and timers run.
//     Oracles: a Version Negotiation answer is never larger than the datagram that caused it
//     (no amplification); a connection's answers stay within three times what it received
//     before its peer is validated (RFC 9000 §8.1).
//  1  after the handshake: a client and a server complete a handshake in memory; the datagrams,
//     each XORed onto a real client packet (so header bits and connection IDs are mostly right)
//     or taken raw, reach the server between real packets; then 16 KiB sent on a stream must
//     arrive intact. What an off-path sender cannot authenticate must not break a connection.
internal import CNGTCP2

struct Identity {
    let certificatePEM: String
    let privateKeyPEM: String

    static func generate(_ name: String) -> Identity {
        var certificate = gnutls_datum_t()
        var key = gnutls_datum_t()
        precondition(cngtcp2_generate_self_signed_p256(name, 30, &certificate, &key) == 0, "certificate generation failed")
        defer {
            cngtcp2_gnutls_free(certificate.data)
            cngtcp2_gnutls_free(key.data)
        }
        func text(_ datum: gnutls_datum_t) -> String {
            String(decoding: UnsafeBufferPointer(start: datum.data, count: Int(datum.size)), as: UTF8.self)
        }
        return Identity(certificatePEM: text(certificate), privateKeyPEM: text(key))
    }
}

let serverConfiguration: QUICConfiguration = {
    let identity = Identity.generate("qxfer-fuzz-server")
    var configuration = QUICConfiguration(certificateChainPEM: identity.certificatePEM, privateKeyPEM: identity.privateKeyPEM, verifyPeer: { _ in true })
    configuration.initialRTT = .milliseconds(10)
    return configuration
}()
let clientConfiguration: QUICConfiguration = {
    let identity = Identity.generate("qxfer-fuzz-client")
    return QUICConfiguration(certificateChainPEM: identity.certificatePEM, privateKeyPEM: identity.privateKeyPEM, verifyPeer: { _ in true })
}()
let retrySecret = [UInt8](repeating: 0x5A, count: 32)
let pathProbe = QUICPathProbe(size: 1200)
let serverAddress = QUICSocketAddress(ipAddress: "10.0.0.1", port: 4433)!
let clientAddress = QUICSocketAddress(ipAddress: "10.0.0.2", port: 50000)!

func datagrams(_ bytes: ArraySlice<UInt8>) -> [[UInt8]] {
    var out: [[UInt8]] = []
    var index = bytes.startIndex
    while index + 2 <= bytes.endIndex, out.count < 64 {
        let length = Int(bytes[index]) << 8 | Int(bytes[index + 1])
        index += 2
        let end = min(bytes.endIndex, index + length)
        out.append(Array(bytes[index..<end]))
        index = end
    }
    return out
}

func drain(_ connection: QUICConnection, now: QUICTime) -> Int {
    var sent = 0
    while let transmit = connection.pollTransmit(now: now) { sent += transmit.data.count }
    while connection.pollEvent() != nil {}
    return sent
}

func beforeHandshake(_ inputs: [[UInt8]]) {
    var now = QUICTime(nanoseconds: 1_000_000_000)
    var server: QUICConnection?
    var received = 0, sent = 0
    for (n, datagram) in inputs.enumerated() {
        now = now.advanced(by: .milliseconds(1))
        let remote = QUICSocketAddress(ipAddress: "10.1.\(n / 250).\(n % 250 + 1)", port: 40000)!
        let path = QUICPath(local: serverAddress, remote: remote)
        if let server {
            received += datagram.count
            try? server.handle(datagram: datagram, path: path, now: now)
            sent += drain(server, now: now)
            continue
        }
        // What a client's path probe (QUICPathProbe) reads before its connection: junk and
        // answers to other probes never count as its answer.
        precondition(!pathProbe.isAnswered(by: datagram), "a path probe took a datagram it did not cause as its answer")
        if case .unsupportedVersion(let header) = QUICPacketHeader.decode(datagram: datagram, shortHeaderConnectionIDLength: 16),
           let answer = QUICVersionNegotiation.write(for: header) {
            precondition(answer.count <= datagram.count, "a \(answer.count)-byte Version Negotiation for a \(datagram.count)-byte datagram")
            continue
        }
        guard let initial = QUICInitialPacket.accept(datagram: datagram) else { continue }
        let original = QUICRetry.validate(initial, remote: remote, secret: retrySecret, now: now)
        guard let connection = try? QUICConnection(serverWith: serverConfiguration, initialPacket: initial, path: path, now: now, retriedFrom: original) else { continue }
        server = connection
        received += datagram.count
        try? connection.handle(datagram: datagram, path: path, now: now)
        sent += drain(connection, now: now)
    }
    guard let server else { return }
    // Before the client proves its address, at most three times what came in (RFC 9000 §8.1).
    if !server.isHandshakeComplete {
        precondition(sent <= 3 * received, "the server sent \(sent) bytes for \(received) from an unvalidated address")
    }
    for _ in 0..<4 {
        guard let deadline = server.nextTimeout else { break }
        now = max(now, deadline)
        server.handleTimeout(now: now)
        _ = drain(server, now: now)
    }
}

/// Lets each connection handle its timer if it has come due.
func runDueTimers(_ connections: QUICConnection..., now: QUICTime) {
    for connection in connections {
        if let deadline = connection.nextTimeout, deadline <= now { connection.handleTimeout(now: now) }
    }
}

/// Moves every pending datagram between the two until both are quiet; returns the client's.
@discardableResult
func exchange(_ client: QUICConnection, _ server: QUICConnection, now: QUICTime, rounds: Int = 50) -> [[UInt8]] {
    let path = QUICPath(local: clientAddress, remote: serverAddress)
    let back = QUICPath(local: serverAddress, remote: clientAddress)
    var fromClient: [[UInt8]] = []
    for _ in 0..<rounds {
        var moved = false
        while let transmit = client.pollTransmit(now: now) {
            for segment in transmit.segments {
                fromClient.append(Array(segment))
                try? server.handle(datagram: Array(segment), path: back, now: now)
                moved = true
            }
        }
        while let transmit = server.pollTransmit(now: now) {
            for segment in transmit.segments {
                try? client.handle(datagram: Array(segment), path: path, now: now)
                moved = true
            }
        }
        if !moved { break }
    }
    return fromClient
}

func afterHandshake(_ inputs: [[UInt8]], rawFlags: UInt8) {
    var now = QUICTime(nanoseconds: 1_000_000_000)
    let path = QUICPath(local: clientAddress, remote: serverAddress)
    let back = QUICPath(local: serverAddress, remote: clientAddress)
    guard let client = try? QUICConnection(clientWith: clientConfiguration, path: path, now: now),
          let first = client.pollTransmit(now: now) else { fatalError("no client Initial") }
    let initialDatagram = Array(first.segments[0])
    guard let initial = QUICInitialPacket.accept(datagram: initialDatagram),
          let server = try? QUICConnection(serverWith: serverConfiguration, initialPacket: initial, path: back, now: now) else {
        fatalError("the server refused a real Initial")
    }
    try? server.handle(datagram: initialDatagram, path: back, now: now)
    // Time moves on between rounds: pacing and the handshake's timers need it.
    var genuine: [[UInt8]] = []
    for _ in 0..<200 where !(client.isHandshakeComplete && server.isHandshakeComplete) {
        genuine += exchange(client, server, now: now)
        now = now.advanced(by: .milliseconds(1))
        runDueTimers(client, server, now: now)
    }
    precondition(client.isHandshakeComplete && server.isHandshakeComplete, "the in-memory handshake did not complete")
    while client.pollEvent() != nil {}
    while server.pollEvent() != nil {}

    // Real client packets to mutate: a short-header packet of the established connection.
    guard let stream = try? client.openStream() else { fatalError("no stream") }
    _ = try? client.write(stream: stream, bytes: [UInt8](repeating: 1, count: 100))
    while let transmit = client.pollTransmit(now: now) { genuine += transmit.segments.map { Array($0) } }
    let base = genuine.last ?? []

    for (n, input) in inputs.enumerated() {
        var datagram: [UInt8]
        if rawFlags >> (n % 8) & 1 == 1 || base.isEmpty {
            datagram = input
        } else {
            datagram = base
            for (i, byte) in input.enumerated() { datagram[i % datagram.count] ^= byte }
        }
        now = now.advanced(by: .microseconds(200))
        try? server.handle(datagram: datagram, path: back, now: now)
        exchange(client, server, now: now, rounds: 2)
    }
    precondition(!server.isClosed && !client.isClosed, "injected datagrams closed the connection")

    // The connection still carries data, intact.
    let payload = (0..<16_384).map { UInt8(truncatingIfNeeded: $0 &* 7) }
    guard let probe = try? client.openStream() else { fatalError("no stream after injection") }
    var written = 0, received: [UInt8] = []
    for _ in 0..<400 where received.count < payload.count {
        if written < payload.count, let count = try? payload[written...].withUnsafeBytes({ try client.write(stream: probe, bytes: $0, finish: true) }) {
            written += count
        }
        now = now.advanced(by: .milliseconds(1))
        exchange(client, server, now: now)
        while let event = server.pollEvent() {
            if case .streamReadable(let id) = event, id == probe, let read = try? server.read(stream: id) { received += read.bytes }
        }
        runDueTimers(client, server, now: now)
    }
    precondition(received == payload, "after the injected datagrams a stream carried \(received.count) of \(payload.count) bytes, or other bytes")
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzQUIC(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let bytes = size == 0 || data == nil ? [] : Array(UnsafeBufferPointer(start: data!, count: size))
    guard let mode = bytes.first else { return 0 }
    if mode & 1 == 0 {
        beforeHandshake(datagrams(bytes.dropFirst()))
    } else {
        afterHandshake(datagrams(bytes.dropFirst(2)), rawFlags: bytes.count > 1 ? bytes[1] : 0)
    }
    return 0
}
