// libFuzzer target: what one peer reads from the other (Sources/QXferReach/Path) — PeerSignal,
// the candidates and splices that come through the relay, and PeerDatagram, every datagram that
// reaches a peer's UDP socket from anyone — and the path engine fed what they decode, as the
// agent feeds it (the route between the relay and a direct path is decided on those bytes).
//
// The input is a script: each step's first byte picks it —
//   a signal's bytes (decoded; valid candidates are given to the engine as the peer's);
//   a datagram's bytes from one of four sources (decoded; punches and answers to punches go to
//     the engine, with the real token or the script's);
//   a punch made with the engine's own token and an answer echoing a nonce it sent, so the
//     direct path and its keepalives are reached without the fuzzer guessing 24 bytes;
//   the relay's `bound`, a lost direct path, punching allowed or stopped;
//   time moving on (0 to 25.5 s) and the engine's tick.
//
// Oracles, beyond "never traps": a decoded signal or datagram encodes back to what decodes to
// itself; the engine sends only to the relay or to a candidate or source it trusts; a direct
// route is always to a trusted address; every datagram it sends decodes as a punch or a bind.
#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials

let peerSources = ["192.0.2.7:4000", "198.51.100.9:5000", "10.0.0.2:6000", "203.0.113.1:7000"]

func checkSent(_ actions: [PathEngine<String>.Action], engine: PathEngine<String>) {
    for action in actions {
        switch action {
        case .toRelay(let bytes):
            precondition(RelayDatagram(decoding: bytes[...]) != nil || PeerDatagram(decoding: bytes[...]) != nil, "the engine sent the relay something undecodable")
        case .send(let bytes, let address):
            precondition(engine.candidates.contains(address) || engine.trustedSources.contains(address), "sent to \(address), neither a candidate nor trusted")
            guard let datagram = PeerDatagram(decoding: bytes[...]) else { preconditionFailure("the engine sent a peer something undecodable") }
            if case .data = datagram { preconditionFailure("the engine sent data of its own") }
        }
    }
    if case .direct(let address) = engine.route {
        precondition(engine.trustedSources.contains(address) || engine.candidates.contains(address), "a direct route to an untrusted address")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzPeer(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let input = size == 0 || data == nil ? [] : Array(UnsafeBufferPointer(start: data!, count: size))
    var script = FuzzScript(input)
    let token = Array(repeating: UInt8(0x11), count: RelayMessage.tokenSize)
    let peerToken = Array(repeating: UInt8(0x22), count: RelayMessage.tokenSize)
    var engine = PathEngine<String>(token: token, bindToken: Array(repeating: 0x33, count: RelayMessage.tokenSize))
    var now = Duration.zero
    var sentNonces: [UInt64] = []
    func note(_ actions: [PathEngine<String>.Action]) {
        checkSent(actions, engine: engine)
        for case .send(let bytes, _) in actions {
            if case .punch(_, let nonce)? = PeerDatagram(decoding: bytes[...]) { sentNonces = Array((sentNonces + [nonce]).suffix(64)) }
        }
    }
    note(engine.start(now: now))
    while !script.isEmpty {
        let step = script.byte()
        switch step % 8 {
        case 0:
            let bytes = script.take(Int(script.byte()) * 4)
            if let signal = try? PeerSignal(decoding: Data(bytes)) {
                let again = try? PeerSignal(decoding: (try? signal.encoded()) ?? Data())
                precondition(again == signal, "a signal does not survive its encoding: \(signal)")
                if case .candidates(let udp, let token) = signal {
                    note(engine.peerKnown(token: Array(token), candidates: udp, now: now))
                }
            }
        case 1:
            let bytes = script.take(Int(script.byte()))
            let source = peerSources[Int(script.byte()) % peerSources.count]
            if let datagram = PeerDatagram(decoding: bytes[...]) {
                precondition(PeerDatagram(decoding: datagram.encoded[...]) == datagram, "a datagram does not survive its encoding")
                switch datagram {
                case .punch(let token, let nonce): note(engine.receivedPunch(token: token, nonce: nonce, from: source, now: now))
                case .punched(let token, let nonce): note(engine.receivedPunched(token: token, nonce: nonce, from: source, now: now))
                case .data: break
                }
            }
        case 2:
            let source = peerSources[Int(script.byte()) % peerSources.count]
            note(engine.receivedPunch(token: token, nonce: UInt64(script.byte()), from: source, now: now))
        case 3:
            let source = peerSources[Int(script.byte()) % peerSources.count]
            let nonce = sentNonces.isEmpty ? 0 : sentNonces[Int(script.byte()) % sentNonces.count]
            note(engine.receivedPunched(token: token, nonce: nonce, from: source, now: now))
        case 4:
            if let address = DatagramAddress(address: script.take(4), port: UInt16(script.byte()) << 8 | UInt16(script.byte())) {
                engine.relayBound(address, now: now)
            }
        case 5:
            switch script.byte() % 3 {
            case 0: note(engine.directPathFailed(now: now))
            case 1: note(engine.allowPunching(now: now))
            default: engine.stopPunching()
            }
        case 6:
            note(engine.peerKnown(token: peerToken, candidates: Array(peerSources.prefix(Int(script.byte()) % 5)), now: now))
        default:
            now += .milliseconds(Int(script.byte()) * 100)
            note(engine.tick(now: now))
        }
    }
    return 0
}
