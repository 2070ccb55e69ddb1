// libFuzzer target: the multicast DNS message parser, DNSMessage(parsing:)
// (Sources/QXferDiscovery/DNSCodec.swift, DNSMessage.swift, DNSName.swift): every packet on
// the LAN reaches it, from anyone.
//
// Input: one UDP payload. Oracles, beyond "never traps" and "never loops" (libFuzzer's
// -timeout catches a hang):
//  - an accepted message holds at most 256 questions and records together, names of at most
//    127 labels of 1…63 bytes and at most 255 bytes on the wire;
//  - re-encoding an accepted message (names compressed) gives a packet that parses back to
//    the same message, when it fits in 9000 bytes (an empty TXT record comes back as one empty
//    string, RFC 6763 section 6.1, so it is compared in that form).

func checkName(_ name: DNSName) {
    precondition(name.labels.count <= 127, "accepted a name of \(name.labels.count) labels")
    precondition(name.labels.allSatisfy { (1...63).contains($0.count) }, "accepted an empty or overlong label")
    precondition(name.wireLength <= 255, "accepted a name of \(name.wireLength) bytes")
}

func normalized(_ record: DNSRecord) -> DNSRecord {
    var record = record
    if case .txt(let strings) = record.data, strings.isEmpty { record.data = .txt([[]]) }
    return record
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzDNS(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let input = size == 0 || data == nil ? [] : Array(UnsafeBufferPointer(start: data!, count: size))
    guard let message = try? DNSMessage(parsing: input) else { return 0 }
    let records = message.answers + message.authorities + message.additionals
    precondition(message.questions.count + records.count <= 256, "accepted too many entries")
    for question in message.questions { checkName(question.name) }
    for record in records {
        checkName(record.name)
        switch record.data {
        case .ptr(let name), .srv(_, _, _, let name): checkName(name)
        default: break
        }
    }
    let encoded = message.encoded
    guard encoded.count <= 9000 else { return 0 }
    let reparsed: DNSMessage
    do {
        reparsed = try DNSMessage(parsing: encoded)
    } catch {
        fatalError("our own encoding of an accepted message does not parse: \(error)")
    }
    var expected = message
    expected.answers = message.answers.map(normalized)
    expected.authorities = message.authorities.map(normalized)
    expected.additionals = message.additionals.map(normalized)
    precondition(reparsed == expected, "an accepted message does not survive re-encoding")
    return 0
}
