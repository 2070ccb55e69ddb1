import FoundationEssentials

/// Which seat of a room a client takes (docs/PROTOCOL.md §9.2): the side that made the code
/// (the sender) offers, the side that typed it (the receiver) answers.
public enum RoomSide: String, Codable, Sendable, Hashable {
    case offer
    case answer
}

/// A message of a relay's control connection, and of a splice's opening (docs/PROTOCOL.md
/// §9.2, §9.4): JSON, each preceded by a 4-byte big-endian length, at most
/// ``maximumSize`` bytes.
public enum RelayMessage: Codable, Sendable, Equatable {
    /// Client → relay, first on a control connection.
    case hello(version: Int, room: String, side: RoomSide)
    /// Relay → client: the client's address as seen, its seat's token, how long the room waits.
    case welcome(observed: String, bindToken: Data, expiresIn: Int)
    /// Relay → client: both sides are present.
    case paired
    /// Client → relay → peer: opaque bytes for the peer (at most ``maximumSignalSize``).
    case signal(data: Data)
    /// Relay → client: the peer's control connection ended.
    case peerGone
    /// Relay → client: the relay stops serving this connection, saying why.
    case refused(reason: String)
    /// Client → relay, first on a splice connection.
    case splice(bindToken: Data, id: Int)
    /// Relay → both splice connections: from now on, bytes are copied both ways.
    case spliced

    /// The protocol version this side speaks.
    public static let version = 1
    /// The largest message either side accepts, length prefix excluded.
    public static let maximumSize = 4096
    /// The largest `signal` payload.
    public static let maximumSignalSize = 2048
    /// A seat's token: 16 random bytes.
    public static let tokenSize = 16

    /// The message with its length prefix, ready to write.
    public func framed() throws -> [UInt8] {
        let body = try JSONEncoder().encode(self)
        guard body.count <= Self.maximumSize else { throw RelayWireError("a relay message of \(body.count) bytes is over the \(Self.maximumSize)-byte limit") }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(4 + body.count)
        withUnsafeBytes(of: UInt32(body.count).bigEndian) { bytes += $0 }
        bytes += body
        return bytes
    }

    /// Checks the fields a decoder cannot: sizes, the room's form, the splice id's range.
    public func validated() throws -> RelayMessage {
        switch self {
        case .hello(_, let room, _):
            guard room.utf8.count == 64, room.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else {
                throw RelayWireError("a room is 64 lowercase hex digits")
            }
        case .welcome(_, let token, let expiresIn):
            guard token.count == Self.tokenSize, expiresIn >= 0 else { throw RelayWireError("a malformed welcome") }
        case .signal(let data):
            guard data.count <= Self.maximumSignalSize else { throw RelayWireError("a signal of \(data.count) bytes is over the \(Self.maximumSignalSize)-byte limit") }
        case .splice(let token, let id):
            guard token.count == Self.tokenSize, (0...0xFFFF).contains(id) else { throw RelayWireError("a malformed splice request") }
        case .paired, .peerGone, .refused, .spliced:
            break
        }
        return self
    }
}

/// A relay message that breaks the protocol; the connection that sent it is closed.
public struct RelayWireError: Error, Sendable, CustomStringConvertible, Equatable {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Splits a control connection's bytes into messages: bounded (one message's bytes at most),
/// so a peer that sends a huge length or never ends a message costs at most 4 KiB.
public struct RelayMessageDecoder: Sendable {
    private var buffer: [UInt8] = []

    public init() {}

    /// Adds bytes; returns every message they complete. Throws on a length over the limit
    /// or a body that is not a valid message.
    public mutating func feed(_ bytes: some Collection<UInt8>) throws -> [RelayMessage] {
        buffer += bytes
        var messages: [RelayMessage] = []
        while buffer.count >= 4 {
            let length = buffer.prefix(4).reduce(0) { $0 << 8 | Int($1) }
            guard length <= RelayMessage.maximumSize else {
                throw RelayWireError("a relay message of \(length) bytes is over the \(RelayMessage.maximumSize)-byte limit")
            }
            guard buffer.count >= 4 + length else { break }
            let body = Data(buffer[4..<4 + length])
            buffer.removeFirst(4 + length)
            let message: RelayMessage
            do { message = try JSONDecoder().decode(RelayMessage.self, from: body) } catch {
                throw RelayWireError("a relay message that does not decode")
            }
            messages.append(try message.validated())
        }
        return messages
    }

    /// Bytes received past the last whole message (a splice hands them on to the peer).
    public var leftover: [UInt8] { buffer }

    /// Takes the leftover bytes, leaving the decoder empty.
    public mutating func takeLeftover() -> [UInt8] {
        defer { buffer = [] }
        return buffer
    }
}

/// A UDP address as the relay reports it: IPv4 or IPv6 bytes and a port.
public struct DatagramAddress: Sendable, Hashable, CustomStringConvertible {
    /// 4 or 16 bytes, network order.
    public let address: [UInt8]
    public let port: UInt16

    public init?(address: [UInt8], port: UInt16) {
        guard address.count == 4 || address.count == 16 else { return nil }
        self.address = address
        self.port = port
    }

    /// "192.0.2.1:7450" or "[2001:db8::1]:7450".
    public var description: String {
        if address.count == 4 { return address.map(String.init).joined(separator: ".") + ":\(port)" }
        var groups: [String] = []
        for index in stride(from: 0, to: 16, by: 2) {
            groups.append(String(UInt16(address[index]) << 8 | UInt16(address[index + 1]), radix: 16))
        }
        return "[" + groups.joined(separator: ":") + "]:\(port)"
    }
}

/// A datagram of the relay's UDP port (docs/PROTOCOL.md §9.3).
public enum RelayDatagram: Sendable, Equatable {
    /// Client → relay: this source address is the seat's.
    case bind(token: [UInt8])
    /// Relay → client: the source address the relay saw.
    case bound(DatagramAddress)
    /// Either way: bytes for the peer, forwarded as they are (type byte included).
    case data(payload: ArraySlice<UInt8>)

    public static let bindType: UInt8 = 0x01
    public static let boundType: UInt8 = 0x02
    public static let dataType: UInt8 = 0x03

    /// Decodes a datagram; nil for anything else (another type, a wrong length).
    public init?(decoding bytes: ArraySlice<UInt8>) {
        guard let type = bytes.first else { return nil }
        let body = bytes.dropFirst()
        switch type {
        case Self.bindType:
            guard body.count == RelayMessage.tokenSize else { return nil }
            self = .bind(token: Array(body))
        case Self.boundType:
            guard let family = body.first else { return nil }
            let length = family == 4 ? 4 : family == 6 ? 16 : 0
            guard length > 0, body.count == 1 + length + 2 else { return nil }
            let address = Array(body.dropFirst().prefix(length))
            let portBytes = body.suffix(2)
            let port = UInt16(portBytes.first!) << 8 | UInt16(portBytes.last!)
            guard let decoded = DatagramAddress(address: address, port: port) else { return nil }
            self = .bound(decoded)
        case Self.dataType:
            self = .data(payload: body)
        default:
            return nil
        }
    }

    /// The datagram's bytes.
    public var encoded: [UInt8] {
        switch self {
        case .bind(let token):
            return [Self.bindType] + token
        case .bound(let address):
            return [Self.boundType, address.address.count == 4 ? 4 : 6] + address.address + [UInt8(address.port >> 8), UInt8(address.port & 0xFF)]
        case .data(let payload):
            return [Self.dataType] + payload
        }
    }
}
