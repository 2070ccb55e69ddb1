/// Why a packet was rejected. Every multicast DNS packet comes from anyone on the link, so the
/// parser treats each as hostile: lengths are checked before they are used, counts are bounded
/// by what the packet can hold, and compression pointers may only point backwards.
struct DNSParseError: Error, Hashable, Sendable, CustomStringConvertible {
    let reason: String
    var description: String { "malformed DNS message: \(reason)" }
}

/// Bounds on what one message may hold.
enum DNSLimits {
    /// RFC 6762 section 17: multicast DNS messages may be up to 9000 bytes.
    static let maximumMessageBytes = 9000
    /// Questions and records together. A full 9000-byte packet of minimal records holds ~800;
    /// real ones hold a few dozen.
    static let maximumEntries = 256
    /// Labels in one name (a 255-byte name holds at most 127).
    static let maximumLabels = 127
    /// Compression pointers followed in one name.
    static let maximumPointers = 32
}

// MARK: - Parsing

extension DNSMessage {
    /// Parses one message, rejecting anything malformed or beyond ``DNSLimits``.
    init(parsing bytes: [UInt8]) throws(DNSParseError) {
        guard bytes.count <= DNSLimits.maximumMessageBytes else { throw DNSParseError(reason: "longer than \(DNSLimits.maximumMessageBytes) bytes") }
        var reader = DNSReader(bytes: bytes)
        let id = try reader.readUInt16()
        let flags = try reader.readUInt16()
        let questionCount = Int(try reader.readUInt16())
        let answerCount = Int(try reader.readUInt16())
        let authorityCount = Int(try reader.readUInt16())
        let additionalCount = Int(try reader.readUInt16())
        let recordCount = answerCount + authorityCount + additionalCount
        guard questionCount + recordCount <= DNSLimits.maximumEntries else {
            throw DNSParseError(reason: "\(questionCount + recordCount) entries (at most \(DNSLimits.maximumEntries))")
        }
        // A question takes at least 5 bytes and a record 11: counts the packet cannot hold
        // are rejected before any work is done for them.
        guard questionCount * 5 + recordCount * 11 <= reader.remaining else {
            throw DNSParseError(reason: "counts exceed what \(bytes.count) bytes can hold")
        }
        self.init(id: id, flags: flags)
        for _ in 0..<questionCount {
            let name = try reader.readName()
            let type = DNSRecordType(rawValue: try reader.readUInt16())
            let classField = try reader.readUInt16()
            questions.append(DNSQuestion(
                name: name, type: type, recordClass: classField & 0x7FFF, unicastResponse: classField & 0x8000 != 0))
        }
        for _ in 0..<answerCount { answers.append(try reader.readRecord()) }
        for _ in 0..<authorityCount { authorities.append(try reader.readRecord()) }
        for _ in 0..<additionalCount { additionals.append(try reader.readRecord()) }
        // Trailing bytes are tolerated (some stacks pad); they are never interpreted.
    }
}

/// A bounds-checked cursor over a received message.
struct DNSReader {
    let bytes: [UInt8]
    private(set) var offset = 0

    init(bytes: [UInt8]) { self.bytes = bytes }

    var remaining: Int { bytes.count - offset }

    mutating func readUInt8() throws(DNSParseError) -> UInt8 {
        guard offset < bytes.count else { throw DNSParseError(reason: "truncated at byte \(offset)") }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func readUInt16() throws(DNSParseError) -> UInt16 {
        guard offset + 2 <= bytes.count else { throw DNSParseError(reason: "truncated at byte \(offset)") }
        defer { offset += 2 }
        return UInt16(bytes[offset]) << 8 | UInt16(bytes[offset + 1])
    }

    mutating func readUInt32() throws(DNSParseError) -> UInt32 {
        UInt32(try readUInt16()) << 16 | UInt32(try readUInt16())
    }

    mutating func readBytes(_ count: Int) throws(DNSParseError) -> [UInt8] {
        guard count >= 0, offset + count <= bytes.count else { throw DNSParseError(reason: "truncated at byte \(offset)") }
        defer { offset += count }
        return Array(bytes[offset..<offset + count])
    }

    /// Reads a possibly compressed name. Each pointer must point before the start of the
    /// labels read so far, so offsets strictly decrease and a loop is impossible; the name's
    /// total length and label count are bounded as the wire format says.
    mutating func readName() throws(DNSParseError) -> DNSName {
        var labels: [[UInt8]] = []
        var wireLength = 1
        var position = offset
        var lowestStart = offset  // a pointer must land strictly below every byte read so far
        var pointers = 0
        var resumeAt: Int?
        while true {
            guard position < bytes.count else { throw DNSParseError(reason: "name runs past the end") }
            let length = bytes[position]
            switch length & 0xC0 {
            case 0x00:
                if length == 0 {
                    offset = resumeAt ?? position + 1
                    return DNSName(labels: labels)
                }
                let start = position + 1
                guard start + Int(length) <= bytes.count else { throw DNSParseError(reason: "label runs past the end") }
                wireLength += 1 + Int(length)
                guard wireLength <= DNSName.maximumWireLength else { throw DNSParseError(reason: "name longer than 255 bytes") }
                guard labels.count < DNSLimits.maximumLabels else { throw DNSParseError(reason: "too many labels") }
                labels.append(Array(bytes[start..<start + Int(length)]))
                position = start + Int(length)
            case 0xC0:
                guard position + 1 < bytes.count else { throw DNSParseError(reason: "compression pointer runs past the end") }
                let target = Int(length & 0x3F) << 8 | Int(bytes[position + 1])
                guard target < lowestStart else { throw DNSParseError(reason: "compression pointer does not point backwards") }
                pointers += 1
                guard pointers <= DNSLimits.maximumPointers else { throw DNSParseError(reason: "too many compression pointers") }
                if resumeAt == nil { resumeAt = position + 2 }
                lowestStart = target
                position = target
            default:
                throw DNSParseError(reason: "unknown label type 0x\(String(length & 0xC0, radix: 16))")
            }
        }
    }

    mutating func readRecord() throws(DNSParseError) -> DNSRecord {
        let name = try readName()
        let type = DNSRecordType(rawValue: try readUInt16())
        let classField = try readUInt16()
        let ttl = try readUInt32()
        let length = Int(try readUInt16())
        guard length <= remaining else { throw DNSParseError(reason: "record data runs past the end") }
        let end = offset + length
        let data: DNSRecordData
        switch type {
        case .a:
            guard length == 4 else { throw DNSParseError(reason: "A record of \(length) bytes") }
            data = .a(try readBytes(4))
        case .aaaa:
            guard length == 16 else { throw DNSParseError(reason: "AAAA record of \(length) bytes") }
            data = .aaaa(try readBytes(16))
        case .ptr:
            data = .ptr(try readName())
        case .srv:
            let priority = try readUInt16()
            let weight = try readUInt16()
            let port = try readUInt16()
            data = .srv(priority: priority, weight: weight, port: port, target: try readName())
        case .txt:
            var strings: [[UInt8]] = []
            while offset < end {
                let count = Int(try readUInt8())
                guard offset + count <= end else { throw DNSParseError(reason: "TXT string runs past its record") }
                strings.append(try readBytes(count))
            }
            data = .txt(strings)
        default:
            data = .other(type, try readBytes(length))
        }
        guard offset == end else { throw DNSParseError(reason: "\(type) record data of \(length) bytes does not match its contents") }
        return DNSRecord(name: name, recordClass: classField & 0x7FFF, cacheFlush: classField & 0x8000 != 0, ttl: ttl, data: data)
    }
}

// MARK: - Writing

extension DNSMessage {
    /// The message on the wire, names compressed.
    var encoded: [UInt8] {
        var writer = DNSWriter(compress: true)
        writer.writeUInt16(id)
        writer.writeUInt16(flags)
        writer.writeUInt16(UInt16(questions.count))
        writer.writeUInt16(UInt16(answers.count))
        writer.writeUInt16(UInt16(authorities.count))
        writer.writeUInt16(UInt16(additionals.count))
        for question in questions {
            writer.writeName(question.name)
            writer.writeUInt16(question.type.rawValue)
            writer.writeUInt16(question.recordClass | (question.unicastResponse ? 0x8000 : 0))
        }
        for record in answers + authorities + additionals { writer.writeRecord(record) }
        return writer.bytes
    }
}

/// Builds a message, remembering where each name suffix was written for compression.
struct DNSWriter {
    private(set) var bytes: [UInt8] = []
    private let compress: Bool
    private var suffixOffsets: [[[UInt8]]: Int] = [:]

    init(compress: Bool) { self.compress = compress }

    mutating func writeUInt16(_ value: UInt16) {
        bytes.append(UInt8(value >> 8))
        bytes.append(UInt8(value & 0xFF))
    }

    mutating func writeUInt32(_ value: UInt32) {
        writeUInt16(UInt16(value >> 16))
        writeUInt16(UInt16(value & 0xFFFF))
    }

    mutating func writeName(_ name: DNSName) {
        let labels = name.labels
        let keys = name.lowercasedLabels
        for index in labels.indices {
            let suffix = Array(keys[index...])
            if compress, let target = suffixOffsets[suffix] {
                writeUInt16(0xC000 | UInt16(target))
                return
            }
            // Pointers hold 14 bits of offset.
            if compress, bytes.count < 0x3FFF { suffixOffsets[suffix] = bytes.count }
            let label = labels[index].prefix(DNSName.maximumLabelLength)
            bytes.append(UInt8(label.count))
            bytes.append(contentsOf: label)
        }
        bytes.append(0)
    }

    mutating func writeRecord(_ record: DNSRecord) {
        writeName(record.name)
        writeUInt16(record.type.rawValue)
        writeUInt16(record.recordClass | (record.cacheFlush ? 0x8000 : 0))
        writeUInt32(record.ttl)
        let lengthAt = bytes.count
        writeUInt16(0)
        writeData(record.data)
        let length = bytes.count - lengthAt - 2
        bytes[lengthAt] = UInt8(length >> 8)
        bytes[lengthAt + 1] = UInt8(length & 0xFF)
    }

    mutating func writeData(_ data: DNSRecordData) {
        switch data {
        case .a(let address), .aaaa(let address):
            bytes.append(contentsOf: address)
        case .ptr(let name):
            writeName(name)
        case .srv(let priority, let weight, let port, let target):
            writeUInt16(priority)
            writeUInt16(weight)
            writeUInt16(port)
            writeName(target)
        case .txt(let strings):
            // RFC 6763 section 6.1: an empty TXT record is one empty string.
            for string in strings.isEmpty ? [[]] : strings {
                let clipped = string.prefix(255)
                bytes.append(UInt8(clipped.count))
                bytes.append(contentsOf: clipped)
            }
        case .other(_, let raw):
            bytes.append(contentsOf: raw)
        }
    }
}
