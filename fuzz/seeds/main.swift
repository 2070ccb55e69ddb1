// Writes the seed corpora under fuzz/corpus/<target>/ from values encoded by the project's own
// encoders (MessageCodec, DNSMessage.encoded, Journal.body), so every seed is a valid input
// the fuzzer mutates from. Built and run by `fuzz/run.sh seeds`; the output is committed.
#if canImport(Glibc)
import Glibc
#endif

let root = CommandLine.arguments.count > 1 ? CommandLine.arguments[1] : "fuzz/corpus"

func write(_ target: String, _ name: String, _ bytes: [UInt8]) {
    let directory = "\(root)/\(target)"
    _ = mkdir(root, 0o755)
    _ = mkdir(directory, 0o755)
    let path = "\(directory)/\(name)"
    guard let file = fopen(path, "wb") else { fatalError("cannot write \(path)") }
    _ = bytes.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, file) }
    fclose(file)
}

// MARK: qxfer/1 messages (targets codec and frames)

let digest16 = (0..<16).map { UInt8($0 * 17 & 0xff) }
let digest32 = (0..<32).map { UInt8($0 * 7 & 0xff) }
let messages: [(String, Message)] = [
    ("offer-file", .offer(Offer(algorithm: .xxh3_128, entries: [
        OfferEntry(kind: .file, path: ["notes.txt"], size: 1234, mode: 0o644, modificationTime: 1_700_000_000_000_000_000),
    ]))),
    ("offer-tree", .offer(Offer(algorithm: .sha256, entries: [
        OfferEntry(kind: .directory, path: ["photos"], mode: 0o755, modificationTime: 1),
        OfferEntry(kind: .file, path: ["photos", "a b.jpg"], size: 1 << 20, mode: 0o600, modificationTime: -5),
        OfferEntry(kind: .symlink, path: ["photos", "latest"], mode: 0o777, modificationTime: 2, linkTarget: "a b.jpg"),
        OfferEntry(kind: .file, flags: .sizeUnknown, path: ["stdin"], mode: 0o644, modificationTime: 3),
    ]))),
    ("accept", .accept(Accept(answers: [
        EntryAnswer(disposition: .send),
        EntryAnswer(disposition: .send, offset: 4096, prefixDigest: digest16),
        EntryAnswer(disposition: .present, prefixDigest: digest32),
        EntryAnswer(disposition: .skip, code: 6),
    ]))),
    ("decline", .decline(Refusal(code: .noSpace, message: "not enough free space: 1 GiB offered, 10 MiB free"))),
    ("filedata", .fileData(FileData(entry: 1, offset: 4096, bytes: Array("hello, world\n".utf8)))),
    ("zeros", .zeros(Zeros(entry: 1, offset: 4109, length: 1 << 20))),
    ("filedone-xxh3", .fileDone(FileDone(entry: 1, size: 4109, algorithm: .xxh3_128, digest: digest16))),
    ("filedone-sha256", .fileDone(FileDone(entry: 0, size: 0, algorithm: .sha256, digest: digest32))),
    ("verified", .verified(entry: 3)),
    ("failed", .failed(EntryFailure(entry: 2, code: .digestMismatch, message: "digest mismatch"))),
    ("complete", .complete(Complete(succeeded: 3, failed: 1))),
    ("error", .error(Refusal(code: .protocolViolation, message: "FileData for a directory"))),
]
for (name, message) in messages {
    write("codec", name, [UInt8(message.type.rawValue)] + MessageCodec.encodeBody(message))
}
// A sender's conversation and a receiver's, as they cross the wire (byte 0 seeds the cutting).
let senderSide: [Message] = messages.filter { [.offer, .fileData, .zeros, .fileDone].contains($0.1.type) }.map(\.1)
let receiverSide: [Message] = messages.filter { ![.offer, .fileData, .zeros, .fileDone].contains($0.1.type) }.map(\.1)
write("frames", "sender", [3] + senderSide.flatMap(MessageCodec.encodeFrame))
write("frames", "receiver", [200] + receiverSide.flatMap(MessageCodec.encodeFrame))
write("frames", "one-offer", [0] + MessageCodec.encodeFrame(messages[0].1))
// An Offer and an Accept in parts (docs/PROTOCOL.md §3.9), cut every 16 bytes: any cut is valid.
func inParts(_ message: Message) -> [UInt8] {
    func frame(_ type: UInt32, _ body: [UInt8]) -> [UInt8] {
        let header: [UInt32] = [type, UInt32(body.count)]
        return header.flatMap { value in (0..<4).map { UInt8(value >> (24 - 8 * $0) & 0xff) } } + body
    }
    let body = MessageCodec.encodeBody(message)
    let type = message.type.rawValue
    let typeBytes = Array(frame(type, []).prefix(4))
    var stream: [UInt8] = []
    var start = 0
    while body.count - start > 16 {
        stream += frame(MessageCodec.continuationType, typeBytes + body[start..<start + 16])
        start += 16
    }
    return stream + frame(type, Array(body[start...]))
}
write("frames", "offer-in-parts", [5] + inParts(messages[1].1) + MessageCodec.encodeFrame(.verified(entry: 0)))
write("frames", "accept-in-parts", [9] + inParts(messages[2].1))

// MARK: paths (target paths): components separated by 0xFF, then the link target

func pathSeed(_ components: [String], _ target: String) -> [UInt8] {
    var out: [UInt8] = []
    for c in components { out += Array(c.utf8) + [0xFF] }
    return out + Array(target.utf8)
}
write("paths", "top-level", pathSeed(["notes.txt"], ""))
write("paths", "nested-link", pathSeed(["a", "b", "c", "link"], "../../x/y"))
write("paths", "sibling-link", pathSeed(["dir", "link"], "./file"))
write("paths", "climb-out", pathSeed(["link"], "../etc/passwd"))
write("paths", "dotdot", pathSeed(["a", "..", "b"], "a/../../b"))
write("paths", "unicode", pathSeed(["Ünïcödé", "\u{202E}txt.exe", "back\\slash"], "..."))
write("paths", "reserved", pathSeed(["x.qxfer-partial"], "/abs"))
write("paths", "slashes", Array("a//b/".utf8))

// MARK: journal: byte 0 odd = body (the harness appends the check line), even = whole file

let journals = [
    Journal(algorithm: .xxh3_128, size: 1 << 20, modificationTime: 1_700_000_000_000_000_000, offset: 524_288, prefixDigest: digest16, partialInode: 1_234_567),
    Journal(algorithm: .sha256, size: 10, modificationTime: -1, offset: 0, prefixDigest: []),
    Journal(algorithm: .sha256, size: 1 << 40, modificationTime: 0, offset: 16 << 20, prefixDigest: digest32, partialInode: .max),
]
for (index, journal) in journals.enumerated() {
    write("journal", "body-\(index)", [1] + Array(journal.body.utf8))
    write("journal", "file-\(index)", [0] + Array((journal.body + "check \(Journal.check(journal.body))\n").utf8))
}

// MARK: dns: multicast DNS packets as qxfer's responder and querier send them

let service = DNSName("_qxfer._udp.local")
let instance = service.prepending("office pc")
let host = DNSName("office-pc.local")
let query = DNSMessage.query([DNSQuestion(name: service, type: .ptr, unicastResponse: true)])
let response = DNSMessage.response(answers: [
    DNSRecord(name: service, ttl: 4500, data: .ptr(instance)),
    DNSRecord(name: instance, cacheFlush: true, ttl: 120, data: .srv(priority: 0, weight: 0, port: 7447, target: host)),
    DNSRecord(name: instance, cacheFlush: true, ttl: 4500, data: .txt([Array("fp=0123abcd".utf8), Array("v=1".utf8)])),
], additionals: [
    DNSRecord(name: host, cacheFlush: true, ttl: 120, data: .a([192, 168, 1, 20])),
    DNSRecord(name: host, cacheFlush: true, ttl: 120, data: .aaaa([0xfe, 0x80] + Array(repeating: 0, count: 13) + [1])),
    DNSRecord(name: host, cacheFlush: true, ttl: 120, data: .other(.nsec, [0xc0, 0x0c, 0, 4, 0x40, 0, 0, 8])),
])
let goodbye = DNSMessage.response(answers: [DNSRecord(name: service, ttl: 0, data: .ptr(instance))])
let knownAnswer = DNSMessage.query([DNSQuestion(name: service, type: .ptr)], knownAnswers: [DNSRecord(name: service, ttl: 4000, data: .ptr(instance))])
write("dns", "query", query.encoded)
write("dns", "response", response.encoded)
write("dns", "goodbye", goodbye.encoded)
write("dns", "known-answer", knownAnswer.encoded)
print("seeds written under \(root)")
