import FoundationEssentials

/// What one peer tells the other through the relay's `signal` (docs/PROTOCOL.md §9.5).
public enum PeerSignal: Codable, Sendable, Equatable {
    /// Where this side's UDP socket can be reached, and the token its punches must carry.
    case candidates(udp: [String], token: Data)
    /// Offer → answer: splice `id` is open on the offer side, for `service`.
    case splice(id: Int, service: Int)

    /// The most candidates a side may list.
    public static let maximumCandidates = 16

    /// The signal's bytes (what the candidates transcript of §9.6 hashes).
    public func encoded() throws -> Data { try JSONEncoder().encode(self) }

    /// Decodes and checks a peer's signal.
    public init(decoding data: Data) throws {
        let signal: PeerSignal
        do { signal = try JSONDecoder().decode(PeerSignal.self, from: data) } catch {
            throw RelayWireError("a peer's signal that does not decode")
        }
        switch signal {
        case .candidates(let udp, let token):
            guard udp.count <= Self.maximumCandidates, token.count == RelayMessage.tokenSize, udp.allSatisfy({ $0.utf8.count <= 64 }) else {
                throw RelayWireError("a peer's candidates are malformed")
            }
        case .splice(let id, let service):
            guard (0...0xFFFF).contains(id), PeerService(rawValue: service) != nil else {
                throw RelayWireError("a peer's splice signal is malformed")
            }
        }
        self = signal
    }
}

/// The two services a peer carries (docs/PROTOCOL.md §9.5).
public enum PeerService: Int, Sendable, Hashable, CaseIterable {
    /// The code's authentication: the pairing exchange of §7 with the code's password.
    case pairing = 0
    /// The qxfer/1 transfer itself.
    case transfer = 1
}

/// A datagram between two peers' UDP sockets, directly or through the relay
/// (docs/PROTOCOL.md §9.5).
public enum PeerDatagram: Sendable, Equatable {
    /// A QUIC datagram of one flow of one service.
    case data(service: UInt8, flow: UInt16, datagram: ArraySlice<UInt8>)
    /// A hole punch carrying the receiving peer's token.
    case punch(token: [UInt8], nonce: UInt64)
    /// The answer to a punch: the puncher's token, the nonce echoed.
    case punched(token: [UInt8], nonce: UInt64)

    public static let punchType: UInt8 = 0x10
    public static let punchedType: UInt8 = 0x11
    /// type, service, flow.
    public static let dataHeaderSize = 4

    public init?(decoding bytes: ArraySlice<UInt8>) {
        guard let type = bytes.first else { return nil }
        switch type {
        case RelayDatagram.dataType:
            guard bytes.count >= Self.dataHeaderSize else { return nil }
            let start = bytes.startIndex
            self = .data(service: bytes[start + 1], flow: UInt16(bytes[start + 2]) << 8 | UInt16(bytes[start + 3]),
                         datagram: bytes[(start + Self.dataHeaderSize)...])
        case Self.punchType, Self.punchedType:
            guard bytes.count == 1 + RelayMessage.tokenSize + 8 else { return nil }
            let token = Array(bytes.dropFirst().prefix(RelayMessage.tokenSize))
            let nonce = bytes.suffix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            self = type == Self.punchType ? .punch(token: token, nonce: nonce) : .punched(token: token, nonce: nonce)
        default:
            return nil
        }
    }

    /// The datagram's bytes.
    public var encoded: [UInt8] {
        switch self {
        case .data(let service, let flow, let datagram):
            return [RelayDatagram.dataType, service, UInt8(flow >> 8), UInt8(flow & 0xFF)] + datagram
        case .punch(let token, let nonce), .punched(let token, let nonce):
            var bytes = [self.isPunch ? Self.punchType : Self.punchedType] + token
            withUnsafeBytes(of: nonce.bigEndian) { bytes += $0 }
            return bytes
        }
    }

    private var isPunch: Bool { if case .punch = self { true } else { false } }
}
