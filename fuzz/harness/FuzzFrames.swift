// libFuzzer target: FrameDecoder (Sources/QXferTransfer/Wire/MessageCodec.swift), the
// splitter that turns a raw byte stream into qxfer/1 messages.
//
// Input: byte 0 seeds how the rest is cut into pieces (as a socket delivers them); the rest is
// the stream. Oracles, beyond "never traps":
//  - feeding the stream in pieces yields exactly the messages (and the same final error, if
//    any) as feeding it in one go: the decoder's buffering never loses or duplicates a byte;
//  - each message re-encodes (encodeBody) to the very bytes it was read from: one frame's body,
//    or, for an Offer or Accept in parts (Continuations, docs/PROTOCOL.md §3.9), the parts'
//    bytes joined;
//  - the decoder never holds more than the bytes fed to it.

enum FrameOutcome: Equatable {
    case message(Message)
    case failure(TransferError.Code)
}

/// Feeds `stream` in pieces of the given sizes (cycled), draining messages after each piece.
func decodeFrames(_ stream: [UInt8], pieces: [Int]) -> [FrameOutcome] {
    var decoder = FrameDecoder()
    var outcomes: [FrameOutcome] = []
    var position = 0
    var piece = 0
    while position < stream.count {
        let n = min(pieces[piece % pieces.count], stream.count - position)
        piece += 1
        decoder.append(stream[position..<position + n])
        position += n
        guard decoder.bufferedByteCount <= position else { fatalError("decoder holds more bytes than it was given") }
        while true {
            do {
                guard let message = try decoder.next() else { break }
                outcomes.append(.message(message))
            } catch {
                outcomes.append(.failure(error.code))
                return outcomes  // the stream is out of sync: the decoder must be discarded
            }
        }
    }
    return outcomes
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzFrames(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    guard let data, size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let seed = Int(input[0])
    let stream = Array(input.dropFirst())
    let whole = decodeFrames(stream, pieces: [max(stream.count, 1)])
    let pieces = [1 + seed % 7, 1 + seed % 3, 8 + seed % 13, 1]
    let split = decodeFrames(stream, pieces: pieces)
    guard whole == split else {
        fatalError("piecewise decoding differs: \(whole.count) outcomes in one go, \(split.count) in pieces")
    }
    // The messages decoded in one go are the stream's prefix, frame by frame.
    var position = 0
    for outcome in whole {
        guard case .message(let message) = outcome else { break }
        var body: [UInt8] = []
        while true {
            guard let (type, part) = frame(in: stream, at: &position) else { fatalError("message \(message.type) from bytes that are not frames") }
            guard type == MessageCodec.continuationType else {
                guard type == message.type.rawValue, body + part == MessageCodec.encodeBody(message) else {
                    fatalError("message \(message.type) does not re-encode to the bytes it came from")
                }
                break
            }
            body += part.dropFirst(4)
        }
    }
    return 0
}

/// The frame at `position` of `stream` (type and body), moving past it; nil if none is whole.
private func frame(in stream: [UInt8], at position: inout Int) -> (UInt32, [UInt8])? {
    guard stream.count - position >= 8 else { return nil }
    let field = { (at: Int) in stream[at..<at + 4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) } }
    let type = field(position), length = Int(field(position + 4))
    guard stream.count - position - 8 >= length else { return nil }
    defer { position += 8 + length }
    return (type, Array(stream[position + 8..<position + 8 + length]))
}
