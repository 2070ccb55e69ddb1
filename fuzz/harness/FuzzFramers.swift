// libFuzzer target: the TLV and Coder framers' rules for the bytes a peer sends
// (Sources/QXferCore/FrameRules.swift: FrameLength; CoderFormat with JSON and binary property
// lists), driven as NetworkConnection drives them: header, length check, body, decode.
// Tests/QXferTests/FramerTests.swift replays the corpus through a real NetworkConnection.
//
// Input: byte 0 picks the framer (TLV, Coder/JSON, Coder/property list), byte 1 the message
// limit (byte × 64); the rest is the byte stream. Oracles beyond "never traps":
//  - a length past the limit is refused before its body is read, with a one-line
//    QXferError (.malformedMessage);
//  - the stream splits into exactly the frames announced; what is left is one truncated frame;
//  - a Coder message that decodes re-encodes to bytes that decode to an equal message.
import Foundation

/// A message with the shapes applications send: strings, integers, bytes, optionals,
/// dictionaries and nesting.
indirect enum Sample: Codable, Equatable {
    case hello(name: String, version: Int64, flags: [Bool])
    case chunk(id: UInt64, bytes: Data, tags: [String: Int]?)
    case nested([Sample])
    case empty
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzFramers(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    guard size >= 2, let data else { return 0 }
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let framer = bytes[0] % 3
    let limit = Int(bytes[1]) * 64
    let stream = bytes[2...]
    let (headerSize, lengthOffset) = framer == 0 ? (8, 4) : (4, 0)
    let format: CoderFormat = framer == 2 ? .propertyList : .json

    var offset = stream.startIndex
    while stream.endIndex - offset >= headerSize {
        let header = stream[offset..<offset + headerSize]
        let length: Int
        do {
            length = try FrameLength.body(in: header, at: lengthOffset, limit: limit)
        } catch {
            precondition([.malformedMessage, .messageTooLarge].contains(error.code) && !error.description.contains("\n"), "unexpected error \(error)")
            let announced = header.dropFirst(lengthOffset).reduce(0) { $0 << 8 | Int($1) }
            precondition(announced > limit, "a \(announced)-byte frame refused under a limit of \(limit)")
            return 0
        }
        precondition(length <= limit)
        guard stream.endIndex - offset - headerSize >= length else { return 0 }  // truncated: the connection reports it
        let body = Data(stream[(offset + headerSize)..<(offset + headerSize + length)])
        offset += headerSize + length
        guard framer != 0 else { continue }
        guard let message = try? format.decode(Sample.self, from: body) else { continue }
        guard let again = try? format.encode(message) else { fatalError("a decoded message does not encode") }
        guard let decoded = try? format.decode(Sample.self, from: again) else { fatalError("our own encoding does not decode") }
        precondition(decoded == message, "a message does not survive re-encoding")
    }
    return 0
}
