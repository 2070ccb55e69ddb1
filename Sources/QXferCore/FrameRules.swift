import FoundationEssentials
import Glibc

// What TLV and Coder do with the bytes a peer sends, apart from any I/O, so that the rules can
// be fuzzed on their own (fuzz/harness/FuzzFramers.swift); the connection code in Framers.swift
// only reads the bytes they ask for.

/// The body length a TLV or Coder frame header announces: a big-endian UInt32 at a fixed offset,
/// refused past the limit before any of the body is buffered.
enum FrameLength {
    static func body(in header: some Collection<UInt8>, at offset: Int, limit: Int) throws(QXferError) -> Int {
        let field = header.dropFirst(offset).prefix(4)
        guard offset >= 0, field.count == 4 else {
            throw QXferError(.malformedMessage, "a \(header.count)-byte frame header has no length at offset \(offset)")
        }
        let length = field.reduce(0) { $0 << 8 | Int($1) }
        guard length <= limit else {
            throw QXferError(.messageTooLarge, "the peer sent a \(length)-byte message; the limit is \(limit) bytes")
        }
        return length
    }
}

/// An encoding for ``Coder``.
public struct CoderFormat: Sendable, Hashable {
    enum Kind: Sendable, Hashable { case json, propertyList }
    let kind: Kind

    /// JSON (`JSONEncoder`).
    public static let json = CoderFormat(kind: .json)
    /// Binary property lists (`PropertyListEncoder`).
    public static let propertyList = CoderFormat(kind: .propertyList)

    func encode<T: Encodable>(_ value: T) throws -> Data {
        switch kind {
        case .json: return try JSONEncoder().encode(value)
        case .propertyList:
            let encoder = PropertyListEncoder()
            encoder.outputFormat = .binary
            return try encoder.encode(value)
        }
    }

    func decode<T: Decodable>(_ type: T.Type, from data: Data) throws -> T {
        switch kind {
        case .json: return try JSONDecoder().decode(type, from: data)
        case .propertyList:
            // Foundation's decoder follows object references without a depth limit: a 138-byte
            // list that contains itself overflows the stack of any recursive Codable type.
            try BinaryPropertyListShape.check(data)
            return try PropertyListDecoder().decode(type, from: data)
        }
    }
}

/// The object graph of a binary property list, checked before Foundation decodes it: every
/// reference in bounds, no object that contains itself, and at most ``maximumDepth`` levels of
/// arrays, sets and dictionaries (JSONDecoder's own limit), so decoding cannot exhaust the stack.
/// Only binary lists are accepted: ``CoderFormat/propertyList`` sends nothing else.
enum BinaryPropertyListShape {
    static let maximumDepth = 512

    static func check(_ data: Data) throws(QXferError) {
        let bytes = [UInt8](data)
        guard bytes.count >= 8 + 32, bytes.starts(with: Array("bplist00".utf8)) else {
            throw malformed("is not a binary property list")
        }
        let trailer = bytes.count - 32
        let offsetSize = Int(bytes[trailer + 6]), referenceSize = Int(bytes[trailer + 7])
        let objectCount = integer(bytes[(trailer + 8)..<(trailer + 16)])
        let topObject = integer(bytes[(trailer + 16)..<(trailer + 24)])
        let offsetTable = integer(bytes[(trailer + 24)..<trailer + 32])
        guard (1...8).contains(offsetSize), (1...8).contains(referenceSize),
              objectCount > 0, objectCount <= trailer, topObject < objectCount,
              offsetTable >= 8, offsetTable <= trailer, objectCount <= (trailer - offsetTable) / offsetSize else {
            throw malformed("has an inconsistent trailer")
        }

        /// The objects a container refers to; none for any other kind of object.
        func references(of object: Int) throws(QXferError) -> ArraySlice<UInt8>? {
            let entry = offsetTable + object * offsetSize
            let start = integer(bytes[entry..<(entry + offsetSize)])
            guard start >= 8, start < offsetTable else { throw malformed("has an object outside its object area") }
            let marker = bytes[start]
            let perEntry: Int
            switch marker >> 4 {
            case 0xA, 0xC: perEntry = 1  // array, set
            case 0xD: perEntry = 2  // dictionary: keys, then values
            default: return nil
            }
            var cursor = start + 1, count = Int(marker & 0x0F)
            if count == 0x0F {
                guard cursor < offsetTable, bytes[cursor] >> 4 == 0x1, bytes[cursor] & 0x0F <= 3 else {
                    throw malformed("has a container with an unreadable size")
                }
                let width = 1 << Int(bytes[cursor] & 0x0F)
                guard cursor + 1 + width <= offsetTable else { throw malformed("has a container with an unreadable size") }
                count = integer(bytes[(cursor + 1)..<(cursor + 1 + width)])
                cursor += 1 + width
            }
            guard count <= (offsetTable - cursor) / (perEntry * referenceSize) else {
                throw malformed("has a container larger than the list")
            }
            return bytes[cursor..<(cursor + count * perEntry * referenceSize)]
        }

        // Heights by an explicit depth-first walk: a reference back to an object still on the
        // path is a cycle; the path never grows past the depth limit.
        var height = [Int](repeating: -1, count: objectCount)  // -1 not seen, -2 on the path
        var path: [(object: Int, references: ArraySlice<UInt8>, tallest: Int)] = []
        func enter(_ object: Int) throws(QXferError) -> Int? {
            guard object < objectCount else { throw malformed("refers to an object it does not have") }
            switch height[object] {
            case -2: throw malformed("contains itself")
            case -1:
                guard let children = try references(of: object) else { height[object] = 0; return 0 }
                guard path.count < maximumDepth else { throw malformed("is nested deeper than \(maximumDepth) levels") }
                height[object] = -2
                path.append((object, children, 0))
                return nil
            case let known: return known
            }
        }
        if try enter(topObject) != nil { return }
        while let top = path.last {
            if top.references.isEmpty {
                path.removeLast()
                height[top.object] = top.tallest + 1
                guard height[top.object] <= maximumDepth else { throw malformed("is nested deeper than \(maximumDepth) levels") }
                if !path.isEmpty { path[path.count - 1].tallest = max(path[path.count - 1].tallest, height[top.object]) }
                continue
            }
            let child = integer(top.references.prefix(referenceSize))
            path[path.count - 1].references = top.references.dropFirst(referenceSize)
            if let known = try enter(child) { path[path.count - 1].tallest = max(path[path.count - 1].tallest, known) }
        }
    }

    /// A big-endian unsigned integer of at most 8 bytes; values past Int.max read as Int.max.
    private static func integer(_ bytes: ArraySlice<UInt8>) -> Int {
        let value = bytes.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        return value > UInt64(Int.max) ? Int.max : Int(value)
    }

    private static func malformed(_ problem: String) -> QXferError {
        QXferError(.malformedMessage, "the peer's property list \(problem)")
    }
}
