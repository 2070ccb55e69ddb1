import CNGTCP2
import QUICEngine
import LinuxSystem
import Testing

/// A hostile client: its 1-RTT packets are rewritten between its framing and its encryption.
///
/// ngtcp2 never sends a frame that breaks the peer's limits, so the client frames a packet
/// normally and this packet-protection backend, standing in for ngtcp2_crypto_gnutls's encrypt
/// callback, replaces the payload of the packet that carries a registered marker with frames
/// the test wrote, padded to the same length, then seals it with the connection's real keys.
/// The victim sees a well-protected packet whose frames break the protocol.
enum FrameTampering {
    /// Marker → the frames that replace the whole payload of the packet carrying it.
    private static let rewrites = Locked<[[UInt8]: [UInt8]]>([:])

    /// Replaces the payload of every short-header packet whose plaintext holds `marker`.
    static func rewrite(packetCarrying marker: [UInt8], with frames: [UInt8]) {
        rewrites.withLock { $0[marker] = frames }
    }

    /// The frames for the packet `plaintext`, or nil to leave it alone.
    fileprivate static func frames(for plaintext: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        rewrites.withLock { table in
            table.first { entry in
                entry.key.count <= plaintext.count && (0...plaintext.count - entry.key.count).contains { start in
                    entry.key.indices.allSatisfy { plaintext[start + $0] == entry.key[$0] }
                }
            }?.value
        }
    }

    /// The backend to give the hostile client's configuration.
    static let protection: QUICPacketProtection = {
        let table = UnsafeMutablePointer<cngtcp2_packet_protection>.allocate(capacity: 1)  // lives as long as the process
        table.initialize(to: cngtcp2_packet_protection(
            set_callbacks: { callbacks, _ in callbacks?.pointee.encrypt = tamperingEncrypt },
            configure_session: { _ in 0 }))  // ngtcp2_crypto_gnutls's keys stay in use
        return QUICPacketProtection(backend: UnsafeRawPointer(table))
    }()
}

private let tamperingEncrypt: ngtcp2_encrypt = { dest, aead, context, plaintext, length, nonce, nonceLength, aad, aadLength in
    // Only 1-RTT packets (short header: the first header bit clear), after the handshake.
    guard let plaintext, let aad, aadLength > 0, aad[0] & 0x80 == 0,
          let frames = FrameTampering.frames(for: UnsafeBufferPointer(start: plaintext, count: length)),
          frames.count <= length else {
        return ngtcp2_crypto_encrypt_cb(dest, aead, context, plaintext, length, nonce, nonceLength, aad, aadLength)
    }
    let payload = frames + [UInt8](repeating: 0, count: length - frames.count)  // the rest PADDING
    return payload.withUnsafeBufferPointer {
        ngtcp2_crypto_encrypt_cb(dest, aead, context, $0.baseAddress, length, nonce, nonceLength, aad, aadLength)
    }
}

/// RFC 9000 §16 variable-length integer.
private func varint(_ value: UInt64) -> [UInt8] {
    func bigEndian(_ v: UInt64, _ count: Int) -> [UInt8] { (0..<count).reversed().map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }
    switch value {
    case ..<(1 << 6): return [UInt8(value)]
    case ..<(1 << 14): return bigEndian(value | 0x4000, 2)
    case ..<(1 << 30): return bigEndian(value | 0x8000_0000, 4)
    default: return bigEndian(value | 0xc000_0000_0000_0000, 8)
    }
}

/// A STREAM frame (RFC 9000 §19.8) with explicit offset and length.
private func streamFrame(_ id: UInt64, offset: UInt64, _ data: [UInt8], fin: Bool = false) -> [UInt8] {
    [fin ? 0x0f : 0x0e] + varint(id) + varint(offset) + varint(UInt64(data.count)) + data
}

/// A DATAGRAM frame with a length field (RFC 9221 §4, type 0x31) whose whole frame is `frameSize` bytes.
private func datagramFrame(frameSize: Int) -> [UInt8] {
    let payload = frameSize - 1 - varint(UInt64(frameSize)).count
    return [0x31] + varint(UInt64(payload)) + [UInt8](repeating: 0xd6, count: payload)
}

/// RFC 9000 §4 and §11 and RFC 9221 §3: a peer that breaks a limit is answered with
/// CONNECTION_CLOSE carrying the matching transport error, not silently dropped (issue 66 item 9).
@Suite struct ProtocolViolationTests {
    static let flowControlError: UInt64 = 0x03
    static let streamLimitError: UInt64 = 0x04
    static let finalSizeError: UInt64 = 0x06
    static let protocolViolation: UInt64 = 0x0a

    static func server() -> QUICConfiguration {
        var server = QUICConfiguration.test(.server, expectPeer: nil)
        server.maxIncomingBidirectionalStreams = 8
        server.initialStreamWindow = 64 << 10
        server.initialConnectionWindow = 256 << 10
        server.maxDatagramFrameSize = 100
        return server
    }

    /// Sends `frames` from the hostile client after the handshake; returns the simulation once
    /// the client has heard the server's CONNECTION_CLOSE (or 5 s passed).
    static func violate(_ name: String, seed: UInt64, frames: [UInt8]) throws -> Simulation {
        var client = QUICConfiguration.test(.client, expectPeer: .server)
        client.packetProtection = FrameTampering.protection
        let marker = Array("qxfer-violation-\(name)-\(seed)".utf8)
        FrameTampering.rewrite(packetCarrying: marker, with: frames)
        let sim = try Simulation(seed: seed, client: client, server: server())
        #expect(sim.runHandshake(), "\(name)")
        let stream = try #require(try sim.client.openStream())
        #expect(try sim.client.write(stream: stream, bytes: marker + [UInt8](repeating: 0x2e, count: 600)) == marker.count + 600)
        sim.run(for: 5_000 * ms) { sim.closeReason(.client) != nil }
        return sim
    }

    /// The server closed with `code` and threw a peer-violation error; the client heard that code,
    /// and both sides' reasons name the error (`errorName`, RFC 9000 §20.1).
    static func expectClosed(_ sim: Simulation, _ name: String, code: UInt64, errorName: String) {
        let local = sim.closeReason(.server)
        #expect(local?.kind == .transport && local?.code == code && local?.initiatedByPeer == false,
                "\(name): the server's close is \(local.map(String.init(describing:)) ?? "none")")
        let heard = sim.closeReason(.client)
        #expect(heard?.kind == .transport && heard?.code == code && heard?.initiatedByPeer == true,
                "\(name): the client heard \(heard.map(String.init(describing:)) ?? "nothing")")
        #expect(sim.serverErrors.contains { $0.code == .peerViolation }, "\(name): \(sim.serverErrors)")
        #expect(local?.reason.hasPrefix(errorName + ": ") == true && heard?.reason == local?.reason,
                "\(name): reasons \(local?.reason ?? "none") / \(heard?.reason ?? "none")")
    }

    @Test func streamBeyondMaxStreamsClosesWithStreamLimitError() throws {
        // Client bidirectional stream 8 × 4 = 32 is the ninth; the server allows eight.
        let sim = try Self.violate("stream-limit", seed: 901, frames: streamFrame(32, offset: 0, Array("ninth".utf8)))
        Self.expectClosed(sim, "stream limit", code: Self.streamLimitError, errorName: "STREAM_LIMIT_ERROR")
    }

    @Test func dataPastTheStreamWindowClosesWithFlowControlError() throws {
        let sim = try Self.violate("stream-window", seed: 902, frames: streamFrame(0, offset: 64 << 10, [1]))
        Self.expectClosed(sim, "stream window", code: Self.flowControlError, errorName: "FLOW_CONTROL_ERROR")
    }

    @Test func dataPastTheConnectionWindowClosesWithFlowControlError() throws {
        // Five streams, each within its 64 KiB window, 300 KiB together against 256 KiB.
        let frames = (0..<5).flatMap { streamFrame(UInt64($0) * 4, offset: 60 << 10, [1]) }
        let sim = try Self.violate("connection-window", seed: 903, frames: frames)
        Self.expectClosed(sim, "connection window", code: Self.flowControlError, errorName: "FLOW_CONTROL_ERROR")
    }

    @Test func dataBeyondTheFinalSizeClosesWithFinalSizeError() throws {
        let frames = streamFrame(0, offset: 0, Array("last".utf8), fin: true) + streamFrame(0, offset: 8, Array("more".utf8))
        let sim = try Self.violate("final-size", seed: 904, frames: frames)
        Self.expectClosed(sim, "final size", code: Self.finalSizeError, errorName: "FINAL_SIZE_ERROR")
    }

    @Test func aFinalSizeChangedByResetClosesWithFinalSizeError() throws {
        // RESET_STREAM (0x04): stream 0, application error 0, final size 100 after a FIN at 4.
        let frames = streamFrame(0, offset: 0, Array("last".utf8), fin: true) + [0x04] + varint(0) + varint(0) + varint(100)
        let sim = try Self.violate("reset-final-size", seed: 905, frames: frames)
        Self.expectClosed(sim, "reset final size", code: Self.finalSizeError, errorName: "FINAL_SIZE_ERROR")
    }

    @Test func aDatagramOverMaxDatagramFrameSizeClosesWithProtocolViolation() throws {
        let sim = try Self.violate("datagram", seed: 906, frames: datagramFrame(frameSize: 101))
        Self.expectClosed(sim, "datagram", code: Self.protocolViolation, errorName: "PROTOCOL_VIOLATION")
    }

    /// The control: a DATAGRAM frame of exactly max_datagram_frame_size arrives and nothing closes,
    /// so the rewriting itself is sound and the limit is the frame's size, not its payload's.
    @Test func aDatagramAtMaxDatagramFrameSizeArrives() throws {
        let sim = try Self.violate("datagram-at-limit", seed: 907, frames: datagramFrame(frameSize: 100))
        let arrived = sim.serverEvents.contains { if case .datagramReceived(let d) = $0 { d.count == 97 } else { false } }
        #expect(arrived && sim.closeReason(.server) == nil && sim.closeReason(.client) == nil)
    }
}
