/// A DNS record type (RFC 1035 and successors): the few multicast DNS service discovery uses are
/// named; others are carried as numbers.
struct DNSRecordType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    let rawValue: UInt16
    init(rawValue: UInt16) { self.rawValue = rawValue }

    static let a = DNSRecordType(rawValue: 1)
    static let ptr = DNSRecordType(rawValue: 12)
    static let txt = DNSRecordType(rawValue: 16)
    static let aaaa = DNSRecordType(rawValue: 28)
    static let srv = DNSRecordType(rawValue: 33)
    static let nsec = DNSRecordType(rawValue: 47)
    /// In questions only: every type.
    static let any = DNSRecordType(rawValue: 255)

    var description: String {
        switch self {
        case .a: "A"
        case .ptr: "PTR"
        case .txt: "TXT"
        case .aaaa: "AAAA"
        case .srv: "SRV"
        case .nsec: "NSEC"
        case .any: "ANY"
        default: "TYPE\(rawValue)"
        }
    }
}

/// The Internet class; multicast DNS uses no other.
let dnsClassIN: UInt16 = 1

/// One question: a name, a type, and whether the asker would like a unicast reply (the
/// "QU" bit, RFC 6762 section 5.4).
struct DNSQuestion: Hashable, Sendable {
    var name: DNSName
    var type: DNSRecordType
    var recordClass: UInt16 = dnsClassIN
    var unicastResponse = false

    /// Whether `record` answers this question.
    func isAnswered(by record: DNSRecord) -> Bool {
        record.name == name && (type == .any || type == record.type) && record.recordClass == recordClass
    }
}

/// The data of a resource record.
enum DNSRecordData: Hashable, Sendable {
    /// An IPv4 address, 4 bytes.
    case a([UInt8])
    /// An IPv6 address, 16 bytes.
    case aaaa([UInt8])
    case ptr(DNSName)
    case srv(priority: UInt16, weight: UInt16, port: UInt16, target: DNSName)
    /// Character strings, each at most 255 bytes.
    case txt([[UInt8]])
    /// Any other type, kept as raw bytes (names inside may be compressed and are not followed).
    case other(DNSRecordType, [UInt8])

    var type: DNSRecordType {
        switch self {
        case .a: .a
        case .aaaa: .aaaa
        case .ptr: .ptr
        case .srv: .srv
        case .txt: .txt
        case .other(let type, _): type
        }
    }

    /// The record data as it is sent without name compression: what RFC 6762 sections 8.2 and
    /// 9 compare when deciding a probe tie-break or a conflict.
    var canonicalBytes: [UInt8] {
        var writer = DNSWriter(compress: false)
        writer.writeData(self)
        return writer.bytes
    }
}

/// A resource record.
struct DNSRecord: Hashable, Sendable {
    var name: DNSName
    var recordClass: UInt16 = dnsClassIN
    /// The "cache-flush" bit: this record is the whole set of its name and type (RFC 6762 section 10.2).
    var cacheFlush = false
    /// Seconds; 0 is a goodbye.
    var ttl: UInt32
    var data: DNSRecordData

    var type: DNSRecordType { data.type }

    /// Whether two records are the same record, TTL and cache-flush bit aside.
    func isSameRecord(as other: DNSRecord) -> Bool {
        name == other.name && recordClass == other.recordClass && data == other.data
    }
}

/// A DNS message: header, questions and three sections of records.
struct DNSMessage: Hashable, Sendable {
    var id: UInt16 = 0
    /// The header flags word: QR, opcode, AA, TC, RD, RA, Z, AD, CD, RCODE.
    var flags: UInt16 = 0
    var questions: [DNSQuestion] = []
    var answers: [DNSRecord] = []
    var authorities: [DNSRecord] = []
    var additionals: [DNSRecord] = []

    static let responseFlag: UInt16 = 0x8000
    static let authoritativeFlag: UInt16 = 0x0400
    static let truncatedFlag: UInt16 = 0x0200

    var isResponse: Bool { flags & Self.responseFlag != 0 }
    var opcode: UInt16 { (flags >> 11) & 0xF }
    var responseCode: UInt16 { flags & 0xF }
    var isTruncated: Bool { flags & Self.truncatedFlag != 0 }

    /// A query (QR clear, opcode 0, id 0 as RFC 6762 section 18.1 asks of multicast queries).
    static func query(_ questions: [DNSQuestion], knownAnswers: [DNSRecord] = [], authorities: [DNSRecord] = []) -> DNSMessage {
        DNSMessage(questions: questions, answers: knownAnswers, authorities: authorities)
    }

    /// An authoritative response (QR and AA set).
    static func response(id: UInt16 = 0, answers: [DNSRecord], additionals: [DNSRecord] = []) -> DNSMessage {
        DNSMessage(id: id, flags: responseFlag | authoritativeFlag, answers: answers, additionals: additionals)
    }
}
