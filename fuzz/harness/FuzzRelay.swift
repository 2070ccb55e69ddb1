// libFuzzer target: the relay (Sources/QXferReach/Relay): its decoders — RelayMessageDecoder
// for control connections and splices, RelayDatagram for its UDP port — and its room table,
// RelayRooms, fed what they decode, as the server feeds it. Every byte a client sends reaches
// these, from anyone on the internet.
//
// The input is a script: each step's first byte picks it —
//   open a connection from one of six addresses (two IPv4, two in one IPv6 /64, …);
//   close one;
//   feed one connection's decoder raw bytes from the script (messages it completes go to the
//     table; a decoder error is a violation, as the server treats it);
//   send one connection a message built from the script (a hello for one of three rooms, a
//     signal, a splice with a token the relay handed out or a wrong one, a message only a relay
//     sends), so deep states are reached without the fuzzer spelling JSON;
//   a datagram of raw bytes, or a bind with a handed-out token, or data, from an address;
//   a splice's bytes charged;
//   time moving on (0 to 1275 s) and the relay's tick.
// Limits are small (3 rooms per address, 5 rooms, 4 splices a room, 3 signals a side, a tiny
// byte allowance), so every refusal is reached.
//
// Oracles, beyond "never traps": after every step the table's own consistency check
// (RelayRooms.inconsistency(): indexes agree, every count within its limit); a message the
// decoder accepts re-encodes (framed) and decodes to itself; a datagram that decodes encodes
// to the same bytes; every `close` action names a connection the table had opened; the relay
// never sends a client-only message (hello, signal it did not carry, splice).
#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials

let relayAddresses: [ClientAddress] = [
    ClientAddress(ipv4: 0xC000_0201, port: 1000), ClientAddress(ipv4: 0xC000_0201, port: 2000),
    ClientAddress(ipv4: 0xC633_6401, port: 1000), ClientAddress(ipv6High: 0x2001_0DB8_0000_0001, low: 1, port: 1000),
    ClientAddress(ipv6High: 0x2001_0DB8_0000_0001, low: 2, port: 1000), ClientAddress(ipv6High: 0x2001_0DB8_0000_0002, low: 1, port: 1),
]
let relayRooms = [String(repeating: "a", count: 64), String(repeating: "0", count: 63) + "1", String(repeating: "f", count: 64)]

func checkDecoded(_ message: RelayMessage) {
    guard let framed = try? message.framed() else { return }
    var decoder = RelayMessageDecoder()
    guard let again = try? decoder.feed(framed) else { preconditionFailure("an accepted message does not decode again: \(message)") }
    precondition(again == [message], "an accepted message decodes to another: \(message) → \(again)")
}

func checkActions(_ actions: [RelayAction], opened: Set<RelayConnectionID>) {
    for action in actions {
        switch action {
        case .send(let message, let to):
            precondition(opened.contains(to), "a message to a connection never opened")
            switch message {
            case .hello, .splice: preconditionFailure("the relay sent a client's message: \(message)")
            default: break
            }
        case .close(let id):
            precondition(opened.contains(id), "a close of a connection never opened")
        case .splice(let first, let second):
            precondition(first != second && opened.contains(first) && opened.contains(second), "a splice of \(first) and \(second)")
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzRelay(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let input = size == 0 || data == nil ? [] : Array(UnsafeBufferPointer(start: data!, count: size))
    var script = FuzzScript(input)
    var limits = RelayLimits()
    limits.maximumRoomsPerAddress = 3
    limits.maximumRooms = 5
    limits.maximumSplicesPerRoom = 4
    limits.maximumSignalsPerSide = 3
    limits.maximumPendingConnectionsPerAddress = 4
    limits.maximumConnections = 24
    limits.allowance = RelayAllowance(burst: 70_000, bytesPerSecond: 2_000)
    var rooms = RelayRooms(limits: limits, seed: 1)
    var now = ContinuousClock.now
    var open: [RelayConnectionID] = []
    var opened: Set<RelayConnectionID> = []
    var decoders: [RelayConnectionID: RelayMessageDecoder] = [:]
    var tokens: [Data] = [Data(count: 16)]

    func apply(_ actions: [RelayAction]) {
        checkActions(actions, opened: opened)
        for case .send(.welcome(_, let token, _), _) in actions { tokens.append(token) }
    }

    var steps = 0
    while !script.isEmpty && steps < 2000 {
        steps += 1
        let step = script.byte()
        let address = relayAddresses[Int(script.byte()) % relayAddresses.count]
        switch step % 8 {
        case 0:
            if case .admitted(let id) = rooms.connectionOpened(from: address, now: now) {
                open.append(id)
                opened.insert(id)
            }
        case 1 where !open.isEmpty:
            let id = open.remove(at: Int(script.byte()) % open.count)
            decoders[id] = nil
            apply(rooms.connectionClosed(id, now: now))
        case 2 where !open.isEmpty:
            let id = open[Int(script.byte()) % open.count]
            let chunk = script.take(Int(script.byte()))
            var decoder = decoders[id] ?? RelayMessageDecoder()
            do {
                let messages = try decoder.feed(chunk)
                decoders[id] = decoder
                for message in messages {
                    checkDecoded(message)
                    apply(rooms.received(message, on: id, now: now))
                }
            } catch {
                precondition(error is RelayWireError, "a decoder error that is not a RelayWireError: \(error)")
                decoders[id] = RelayMessageDecoder()
                apply(rooms.violation(on: id, "\(error)"))
            }
        case 3 where !open.isEmpty:
            let id = open[Int(script.byte()) % open.count]
            let pick = script.byte()
            let room = relayRooms[Int(pick >> 4) % relayRooms.count]
            let token = tokens[Int(script.byte()) % tokens.count]
            let message: RelayMessage = switch pick % 8 {
            case 0: .hello(version: 1, room: room, side: .offer)
            case 1: .hello(version: 1, room: room, side: .answer)
            case 2: .hello(version: Int(pick >> 3), room: room, side: .offer)
            case 3: .signal(data: Data(script.take(Int(script.byte()) % 8)))
            case 4: .splice(bindToken: token, id: Int(script.byte() % 6))
            case 5: .splice(bindToken: token, id: Int(script.byte()) << 8 | Int(script.byte()))
            case 6: .welcome(observed: "x", bindToken: token, expiresIn: 0)
            default: [.paired, .peerGone, .spliced, .refused(reason: "")][Int(pick >> 3) % 4]
            }
            apply(rooms.received(message, on: id, now: now))
        case 4:
            let bytes = script.take(Int(script.byte()))
            if let datagram = RelayDatagram(decoding: bytes[...]) {
                precondition(datagram.encoded == bytes, "a datagram does not encode to its bytes")
            }
            _ = rooms.datagram(bytes[...], from: address, now: now)
        case 5:
            let kind = script.byte()
            let bytes: [UInt8] = kind % 2 == 0
                ? [RelayDatagram.bindType] + tokens[Int(kind >> 1) % tokens.count]
                : [RelayDatagram.dataType] + [UInt8](repeating: 0, count: Int(script.byte()) * 64)
            if case .forward(let target) = rooms.datagram(bytes[...], from: address, now: now) {
                precondition(target != address, "a datagram forwarded back to its sender")
            }
        case 6 where !open.isEmpty:
            let id = open[Int(script.byte()) % open.count]
            let count = Int(script.byte()) << 10
            if let wait = rooms.spliceRelayed(count, on: id, now: now) {
                precondition(wait > .zero && wait <= .seconds(3_700), "a wait of \(wait)")
            }
        case 7:
            now += .seconds(Int(script.byte()) * 5)
            apply(rooms.tick(now: now))
        default:
            break
        }
        if let problem = rooms.inconsistency() { preconditionFailure("the room table disagrees with itself: \(problem)") }
    }
    return 0
}
