// libFuzzer target: FrameDecoder (Sources/QXferTransfer/Wire/MessageCodec.swift), the
// splitter that turns a raw byte stream into qxfer/1 messages.
//
// Input: byte 0 seeds how the rest is cut into pieces (as a socket delivers them); the rest is
// the stream. Oracles, beyond "never traps":
//  - feeding the stream in pieces yields exactly the messages (and the same final error, if
//    any) as feeding it in one go: the decoder's buffering never loses or duplicates a byte;
//  - each message re-encodes (encodeFrame) to the very bytes it was read from;
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
        let frame = MessageCodec.encodeFrame(message)
        guard position + frame.count <= stream.count, Array(stream[position..<position + frame.count]) == frame else {
            fatalError("message \(message.type) does not re-encode to the bytes it came from")
        }
        position += frame.count
    }
    return 0
}
