// libFuzzer target: the qxfer/1 message decoder, MessageCodec.decode(type:body:)
// (Sources/QXferTransfer/Wire/MessageCodec.swift).
//
// Input: byte 0 chooses the message type (value % 11: 1…9 are the real types, 0 and 10 are
// unknown ones that must be refused); the rest is the body.
// Oracles, beyond "never traps":
//  - a failure is one of the three codes the decoder documents (malformed, limit-exceeded,
//    unsupported);
//  - a decoded message has the requested type and re-encodes to exactly the bytes it came
//    from (the encoding is canonical, so nothing is silently dropped or reinterpreted).

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzCodec(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    guard let data, size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let type = UInt32(input[0] % 11)
    let body = Array(input.dropFirst())
    do {
        let message = try MessageCodec.decode(type: type, body: body)
        guard message.type.rawValue == type else {
            fatalError("decoded a \(message.type) from a type-\(type) frame")
        }
        let again = MessageCodec.encodeBody(message)
        guard again == body else {
            fatalError("re-encoding changed the body: \(body.count) bytes in, \(again.count) out")
        }
    } catch {
        switch error.code {
        case .malformed, .limitExceeded, .unsupported: break
        // docs/PROTOCOL.md §3.6: a Batch inside a Batch is a protocol-violation, not malformed.
        case .protocolViolation where type == MessageType.batch.rawValue && error.message == "a Batch inside a Batch": break
        default: fatalError("unexpected error code \(error.code): \(error.message)")
        }
        guard !error.message.contains("\n") else { fatalError("a multi-line error message") }
    }
    return 0
}
