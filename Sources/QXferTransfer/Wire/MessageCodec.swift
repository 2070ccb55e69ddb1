import FoundationEssentials

/// Encodes and decodes qxfer/1 messages, sans-IO.
///
/// A frame is `type (UInt32 BE) | length (UInt32 BE) | body`, exactly what the `TLV` framer of
/// the connection API produces, so a connection built as `TLV { TLS() }` carries
/// ``encodeBody(_:)`` / ``decode(type:body:)`` directly; ``encodeFrame(_:)`` and
/// ``FrameDecoder`` do the framing for a raw byte stream.
///
/// Decoding never traps and never allocates more than the bytes already received justify:
/// every length and count is checked against ``ProtocolLimits`` and against the bytes remaining
/// before anything is reserved. Failures are ``TransferError`` with code `malformed`,
/// `limit-exceeded` or `unsupported`.
public enum MessageCodec {
    /// The bytes of a frame header.
    public static let headerSize = 8

    /// Encodes a message's body (without the frame header).
    public static func encodeBody(_ message: Message) -> [UInt8] {
        var w = ByteWriter()
        switch message {
        case .offer(let offer):
            w.u8(offer.algorithm.rawValue)
            w.u8(offer.flags.rawValue)
            w.u32(UInt32(truncatingIfNeeded: offer.entries.count))
            for entry in offer.entries {
                w.u8(entry.kind.rawValue)
                w.u8(entry.flags.rawValue)
                w.u16(UInt16(truncatingIfNeeded: entry.path.count))
                for component in entry.path { w.string16(component) }
                w.u64(entry.size)
                w.u32(entry.mode)
                w.u64(UInt64(bitPattern: entry.modificationTime))
                w.string16(entry.linkTarget)
            }
        case .accept(let accept):
            w.u32(UInt32(truncatingIfNeeded: accept.answers.count))
            for answer in accept.answers {
                w.u8(answer.disposition.rawValue)
                w.u16(answer.code)
                w.u64(answer.offset)
                w.u8(UInt8(truncatingIfNeeded: answer.prefixDigest.count))
                w.bytes(answer.prefixDigest)
            }
        case .decline(let refusal), .error(let refusal):
            w.u16(refusal.code.rawValue)
            w.string16(clipped(refusal.message))
        case .fileData(let data):
            w.u32(data.entry)
            w.u64(data.offset)
            w.bytes(data.bytes)
        case .zeros(let zeros):
            w.u32(zeros.entry)
            w.u64(zeros.offset)
            w.u64(zeros.length)
        case .fileDone(let done):
            w.u32(done.entry)
            w.u64(done.size)
            w.u8(done.algorithm.rawValue)
            w.u8(UInt8(truncatingIfNeeded: done.digest.count))
            w.bytes(done.digest)
        case .verified(let entry):
            w.u32(entry)
        case .failed(let failure):
            w.u32(failure.entry)
            w.u16(failure.code.rawValue)
            w.string16(clipped(failure.message))
        case .complete(let complete):
            w.u32(complete.succeeded)
            w.u32(complete.failed)
        case .batch(let messages):
            for message in messages { w.bytes(encodeFrame(message)) }
        }
        return w.buffer
    }

    /// A message text cut to ``ProtocolLimits/maximumMessageTextLength`` bytes on a character
    /// boundary, so that a long local message never makes the peer reject the frame.
    static func clipped(_ text: String) -> String {
        guard text.utf8.count > ProtocolLimits.maximumMessageTextLength else { return text }
        var out = ""
        var bytes = 0
        for character in text {
            let n = character.utf8.count
            if bytes + n > ProtocolLimits.maximumMessageTextLength - 3 { break }
            out.append(character)
            bytes += n
        }
        return out + "…"
    }

    /// Encodes a whole frame: header and body.
    public static func encodeFrame(_ message: Message) -> [UInt8] {
        let body = encodeBody(message)
        var w = ByteWriter()
        w.buffer.reserveCapacity(headerSize + body.count)
        w.u32(message.type.rawValue)
        w.u32(UInt32(truncatingIfNeeded: body.count))
        w.bytes(body)
        return w.buffer
    }

    /// Decodes one message body of the given type. The whole body must be consumed. An Offer or
    /// Accept body may be one put together from parts (``MessageAssembler``), up to
    /// ``ProtocolLimits/maximumLongMessageSize``; any other, at most one frame's.
    public static func decode(type: UInt32, body: [UInt8]) throws(TransferError) -> Message {
        let limit = mayComeInParts(type) ? ProtocolLimits.maximumLongMessageSize : ProtocolLimits.maximumMessageSize
        guard body.count <= limit else {
            throw TransferError(.limitExceeded, "message of \(body.count) bytes exceeds the \(limit)-byte limit")
        }
        guard let messageType = MessageType(rawValue: type) else {
            throw TransferError(.malformed, "unknown message type \(type)")
        }
        var r = ByteReader(body)
        let message: Message
        switch messageType {
        case .offer: message = .offer(try decodeOffer(&r))
        case .accept: message = .accept(try decodeAccept(&r))
        case .decline: message = .decline(try decodeRefusal(&r))
        case .error: message = .error(try decodeRefusal(&r))
        case .fileData:
            let entry = try r.u32()
            let offset = try r.u64()
            let count = r.remaining
            guard count > 0 else { throw TransferError(.malformed, "empty FileData") }
            guard count <= ProtocolLimits.maximumChunkSize else {
                throw TransferError(.limitExceeded, "FileData of \(count) bytes exceeds the \(ProtocolLimits.maximumChunkSize)-byte chunk limit")
            }
            guard offset <= UInt64.max - UInt64(count) else { throw TransferError(.malformed, "FileData offset overflows") }
            message = .fileData(FileData(entry: entry, offset: offset, bytes: try r.bytes(count)))
        case .zeros:
            let entry = try r.u32()
            let offset = try r.u64()
            let length = try r.u64()
            guard length > 0 else { throw TransferError(.malformed, "Zeros of length 0") }
            guard length <= ProtocolLimits.maximumZerosLength else {
                throw TransferError(.limitExceeded, "Zeros of \(length) bytes exceeds the \(ProtocolLimits.maximumZerosLength)-byte limit")
            }
            guard offset <= UInt64.max - length else { throw TransferError(.malformed, "Zeros offset overflows") }
            message = .zeros(Zeros(entry: entry, offset: offset, length: length))
        case .fileDone:
            let entry = try r.u32()
            let size = try r.u64()
            let algorithm = try decodeAlgorithm(try r.u8())
            let length = Int(try r.u8())
            guard length == algorithm.digestLength else {
                throw TransferError(.malformed, "\(algorithm.name) digest of \(length) bytes (expected \(algorithm.digestLength))")
            }
            message = .fileDone(FileDone(entry: entry, size: size, algorithm: algorithm, digest: try r.bytes(length)))
        case .verified:
            message = .verified(entry: try r.u32())
        case .failed:
            let entry = try r.u32()
            let code = TransferError.Code(rawValue: try r.u16())
            message = .failed(EntryFailure(entry: entry, code: code, message: try r.string16(limit: ProtocolLimits.maximumMessageTextLength, what: "message")))
        case .complete:
            message = .complete(Complete(succeeded: try r.u32(), failed: try r.u32()))
        case .batch:
            message = .batch(try decodeBatch(&r))
        }
        guard r.remaining == 0 else {
            throw TransferError(.malformed, "\(r.remaining) trailing bytes after \(messageType) message")
        }
        return message
    }

    /// The smallest encoding of one offer entry: kind, flags, component count, size, mode,
    /// mtime and link-target length, with no components.
    static let minimumEntrySize = 1 + 1 + 2 + 8 + 4 + 8 + 2
    /// The size of one Accept answer with an empty digest.
    static let minimumAnswerSize = 1 + 2 + 8 + 1

    static func decodeAlgorithm(_ raw: UInt8) throws(TransferError) -> DigestAlgorithm {
        guard let algorithm = DigestAlgorithm(rawValue: raw) else {
            throw TransferError(.unsupported, "unknown digest algorithm \(raw)")
        }
        return algorithm
    }

    static func decodeCount(_ r: inout ByteReader, minimumItemSize: Int, what: String) throws(TransferError) -> Int {
        let count = Int(try r.u32())
        guard count <= ProtocolLimits.maximumEntries else {
            throw TransferError(.limitExceeded, "\(count) \(what) exceed the limit of \(ProtocolLimits.maximumEntries)")
        }
        guard count <= r.remaining / minimumItemSize else {
            throw TransferError(.malformed, "\(count) \(what) cannot fit in \(r.remaining) bytes")
        }
        return count
    }

    /// The frames of a Batch body: at least one, each complete, none a Batch itself, at most
    /// ``ProtocolLimits/maximumBatchFrames``. The list is bounded before it grows.
    static func decodeBatch(_ r: inout ByteReader) throws(TransferError) -> [Message] {
        guard r.remaining > 0 else { throw TransferError(.malformed, "empty Batch") }
        var messages: [Message] = []
        messages.reserveCapacity(min(r.remaining / headerSize, ProtocolLimits.maximumBatchFrames))
        while r.remaining > 0 {
            guard messages.count < ProtocolLimits.maximumBatchFrames else {
                throw TransferError(.limitExceeded, "a Batch of more than \(ProtocolLimits.maximumBatchFrames) frames")
            }
            let type = try r.u32()
            let length = Int(try r.u32())
            guard length <= r.remaining else {
                throw TransferError(.malformed, "a frame in a Batch claims \(length) bytes, \(r.remaining) are left")
            }
            guard type != MessageType.batch.rawValue else {
                throw TransferError(.protocolViolation, "a Batch inside a Batch")
            }
            messages.append(try decode(type: type, body: try r.bytes(length)))
        }
        return messages
    }

    static func decodeOffer(_ r: inout ByteReader) throws(TransferError) -> Offer {
        let algorithm = try decodeAlgorithm(try r.u8())
        let offerFlags = Offer.Flags(rawValue: try r.u8())
        guard Offer.Flags.known.isSuperset(of: offerFlags) else { throw TransferError(.unsupported, "unknown offer flags \(offerFlags.rawValue)") }
        let count = try decodeCount(&r, minimumItemSize: minimumEntrySize, what: "entries")
        var entries: [OfferEntry] = []
        entries.reserveCapacity(count)
        var earlyBytes: UInt64 = 0
        for index in 0..<count {
            let rawKind = try r.u8()
            guard let kind = EntryKind(rawValue: rawKind) else {
                throw TransferError(.malformed, "entry \(index): unknown kind \(rawKind)")
            }
            let flags = OfferEntry.Flags(rawValue: try r.u8())
            guard OfferEntry.Flags.known.isSuperset(of: flags) else {
                throw TransferError(.unsupported, "entry \(index): unknown flags \(flags.rawValue)")
            }
            let depth = Int(try r.u16())
            guard depth >= 1 else { throw TransferError(.malformed, "entry \(index): empty path") }
            guard depth <= ProtocolLimits.maximumDepth else {
                throw TransferError(.limitExceeded, "entry \(index): path of \(depth) components exceeds the depth limit of \(ProtocolLimits.maximumDepth)")
            }
            guard depth <= r.remaining / 2 else { throw TransferError(.malformed, "entry \(index): truncated path") }
            var path: [String] = []
            path.reserveCapacity(depth)
            for _ in 0..<depth {
                path.append(try r.string16(limit: ProtocolLimits.maximumNameLength, what: "path component"))
            }
            let size = try r.u64()
            let mode = try r.u32()
            guard mode & ~0o7777 == 0 else { throw TransferError(.malformed, "entry \(index): mode \(mode) has non-permission bits") }
            let mtime = Int64(bitPattern: try r.u64())
            let target = try r.string16(limit: ProtocolLimits.maximumLinkTargetLength, what: "link target")
            switch kind {
            case .symlink:
                guard !target.isEmpty else { throw TransferError(.malformed, "entry \(index): symlink without a target") }
            case .file, .directory:
                guard target.isEmpty else { throw TransferError(.malformed, "entry \(index): link target on a non-link") }
            }
            guard kind == .file || (size == 0 && flags.isEmpty) else {
                throw TransferError(.malformed, "entry \(index): size or flags on a \(kind)")
            }
            guard !flags.contains(.sizeUnknown) || size == 0 else {
                throw TransferError(.malformed, "entry \(index): size on an entry of unknown size")
            }
            if flags.contains(.early) {
                guard offerFlags.contains(.early), !flags.contains(.sizeUnknown), size <= ProtocolLimits.maximumEarlyFileSize else {
                    throw TransferError(.malformed, "entry \(index): marked early, but not a file of known size up to \(ProtocolLimits.maximumEarlyFileSize) bytes in an offer of early files")
                }
                earlyBytes += size  // at most 4 MiB before, 256 KiB added: no overflow
                guard earlyBytes <= ProtocolLimits.maximumEarlyBytes else {
                    throw TransferError(.limitExceeded, "the early files add up to more than \(ProtocolLimits.maximumEarlyBytes) bytes")
                }
            }
            entries.append(OfferEntry(kind: kind, flags: flags, path: path, size: size, mode: mode, modificationTime: mtime, linkTarget: target))
        }
        return Offer(algorithm: algorithm, entries: entries, flags: offerFlags)
    }

    static func decodeAccept(_ r: inout ByteReader) throws(TransferError) -> Accept {
        let count = try decodeCount(&r, minimumItemSize: minimumAnswerSize, what: "answers")
        var answers: [EntryAnswer] = []
        answers.reserveCapacity(count)
        for index in 0..<count {
            let raw = try r.u8()
            guard let disposition = EntryAnswer.Disposition(rawValue: raw) else {
                throw TransferError(.malformed, "answer \(index): unknown disposition \(raw)")
            }
            let code = try r.u16()
            let offset = try r.u64()
            let length = Int(try r.u8())
            guard length <= ProtocolLimits.maximumDigestLength else {
                throw TransferError(.limitExceeded, "answer \(index): digest of \(length) bytes")
            }
            let digest = try r.bytes(length)
            switch disposition {
            case .send:
                guard code == 0, (offset == 0) == digest.isEmpty else {
                    throw TransferError(.malformed, "answer \(index): a resume offset needs a prefix digest and only then")
                }
            case .present:
                guard code == 0, offset == 0, !digest.isEmpty else { throw TransferError(.malformed, "answer \(index): 'present' needs a digest") }
            case .skip:
                guard code != 0, offset == 0, digest.isEmpty else { throw TransferError(.malformed, "answer \(index): 'skip' needs a code and nothing else") }
            }
            answers.append(EntryAnswer(disposition: disposition, code: code, offset: offset, prefixDigest: digest))
        }
        return Accept(answers: answers)
    }

    static func decodeRefusal(_ r: inout ByteReader) throws(TransferError) -> Refusal {
        let code = TransferError.Code(rawValue: try r.u16())
        let text = try r.string16(limit: ProtocolLimits.maximumMessageTextLength, what: "message")
        return Refusal(code: code, message: text)
    }
}

/// Splits a byte stream into qxfer/1 messages, sans-IO: feed bytes as they arrive, take
/// messages out; an Offer or Accept in parts comes out whole (``MessageAssembler``). A frame
/// whose length exceeds the limit fails before its body is buffered.
public struct FrameDecoder: Sendable {
    private var buffer: [UInt8] = []
    private var start = 0
    private var assembler = MessageAssembler()
    /// The largest body accepted (default ``ProtocolLimits/maximumMessageSize``).
    public let maximumMessageSize: Int

    public init(maximumMessageSize: Int = ProtocolLimits.maximumMessageSize) {
        self.maximumMessageSize = min(maximumMessageSize, ProtocolLimits.maximumMessageSize)
    }

    /// Bytes received but not yet returned as a message.
    public var bufferedByteCount: Int { buffer.count - start }

    /// Appends received bytes.
    public mutating func append(_ bytes: some Sequence<UInt8>) {
        if start > 0 && start >= buffer.count / 2 {
            buffer.removeFirst(start)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// The next complete message, or nil if more bytes are needed. After an error the decoder
    /// must be discarded (the stream is no longer in sync).
    public mutating func next() throws(TransferError) -> Message? {
        while let (type, body) = try nextFrame() {
            if let message = try assembler.take(type: type, body: Data(body)) { return message }
        }
        return nil
    }

    private mutating func nextFrame() throws(TransferError) -> (type: UInt32, body: [UInt8])? {
        guard buffer.count - start >= MessageCodec.headerSize else { return nil }
        var header = ByteReader(Array(buffer[start..<start + MessageCodec.headerSize]))
        let type = try header.u32()
        let length = Int(try header.u32())
        guard length <= maximumMessageSize else {
            throw TransferError(.limitExceeded, "message of \(length) bytes exceeds the \(maximumMessageSize)-byte limit")
        }
        guard MessageType(rawValue: type) != nil || type == MessageCodec.continuationType else {
            throw TransferError(.malformed, "unknown message type \(type)")
        }
        let bodyStart = start + MessageCodec.headerSize
        guard buffer.count - bodyStart >= length else { return nil }
        let body = Array(buffer[bodyStart..<bodyStart + length])
        start = bodyStart + length
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: buffer.capacity <= 2 * ProtocolLimits.maximumChunkSize)
            start = 0
        }
        return (type, body)
    }
}

/// Big-endian writer.
struct ByteWriter {
    var buffer: [UInt8] = []
    mutating func u8(_ v: UInt8) { buffer.append(v) }
    mutating func u16(_ v: UInt16) { buffer.append(UInt8(v >> 8)); buffer.append(UInt8(v & 0xff)) }
    mutating func u32(_ v: UInt32) { for shift in stride(from: 24, through: 0, by: -8) { buffer.append(UInt8((v >> UInt32(shift)) & 0xff)) } }
    mutating func u64(_ v: UInt64) { for shift in stride(from: 56, through: 0, by: -8) { buffer.append(UInt8((v >> UInt64(shift)) & 0xff)) } }
    mutating func bytes(_ b: [UInt8]) { buffer.append(contentsOf: b) }
    mutating func bytes(_ b: Data) { buffer.append(contentsOf: b) }
    /// UInt16 length then UTF-8 bytes (callers keep strings within limits; longer ones are cut).
    mutating func string16(_ s: String) {
        var utf8 = Array(s.utf8)
        if utf8.count > Int(UInt16.max) { utf8.removeLast(utf8.count - Int(UInt16.max)) }
        u16(UInt16(utf8.count))
        bytes(utf8)
    }
}

/// Big-endian reader that checks the remaining length before every read.
struct ByteReader {
    private let data: [UInt8]
    private var index = 0
    init(_ data: [UInt8]) { self.data = data }
    var remaining: Int { data.count - index }

    private mutating func need(_ n: Int) throws(TransferError) {
        guard n >= 0, remaining >= n else { throw TransferError(.malformed, "message truncated") }
    }
    mutating func u8() throws(TransferError) -> UInt8 {
        try need(1)
        defer { index += 1 }
        return data[index]
    }
    mutating func u16() throws(TransferError) -> UInt16 {
        try need(2)
        defer { index += 2 }
        return UInt16(data[index]) << 8 | UInt16(data[index + 1])
    }
    mutating func u32() throws(TransferError) -> UInt32 {
        try need(4)
        var v: UInt32 = 0
        for i in 0..<4 { v = v << 8 | UInt32(data[index + i]) }
        index += 4
        return v
    }
    mutating func u64() throws(TransferError) -> UInt64 {
        try need(8)
        var v: UInt64 = 0
        for i in 0..<8 { v = v << 8 | UInt64(data[index + i]) }
        index += 8
        return v
    }
    mutating func bytes(_ n: Int) throws(TransferError) -> [UInt8] {
        try need(n)
        defer { index += n }
        return Array(data[index..<index + n])
    }
    /// UInt16 length, checked against `limit`, then strictly valid UTF-8.
    mutating func string16(limit: Int, what: String) throws(TransferError) -> String {
        let n = Int(try u16())
        guard n <= limit else { throw TransferError(.limitExceeded, "\(what) of \(n) bytes exceeds the \(limit)-byte limit") }
        let raw = try bytes(n)
        guard let s = String(validating: raw, as: UTF8.self) else {
            throw TransferError(.malformed, "\(what) is not valid UTF-8")
        }
        return s
    }
}

// MARK: - Offers and Accepts in parts (docs/PROTOCOL.md §3.9)

extension MessageCodec {
    /// The frame type of a Continuation: the next part of an Offer's or Accept's body.
    public static let continuationType: UInt32 = 12

    /// Whether messages of this type may come in parts.
    static func mayComeInParts(_ type: UInt32) -> Bool {
        type == MessageType.offer.rawValue || type == MessageType.accept.rawValue
    }

    /// The frames to send `message` in, as (type, body): the message alone when its body fits in
    /// one frame; otherwise (an Offer or Accept only) Continuations of
    /// ``ProtocolLimits/maximumMessageSize`` bytes less the 4-byte type, then a last part of the
    /// message's own type. A longer body of another type stays whole, for the framer to refuse.
    public static func frames(of message: Message) -> [(type: UInt32, body: [UInt8])] {
        let body = encodeBody(message)
        let type = message.type.rawValue
        guard body.count > ProtocolLimits.maximumMessageSize, mayComeInParts(type) else { return [(type, body)] }
        let partSize = ProtocolLimits.maximumMessageSize - 4
        var frames: [(type: UInt32, body: [UInt8])] = []
        var start = 0
        while body.count - start > ProtocolLimits.maximumMessageSize {
            var w = ByteWriter()
            w.buffer.reserveCapacity(ProtocolLimits.maximumMessageSize)
            w.u32(type)
            w.buffer.append(contentsOf: body[start..<start + partSize])
            frames.append((continuationType, w.buffer))
            start += partSize
        }
        frames.append((type, Array(body[start...])))
        return frames
    }

    /// The length of an Accept's body holding `answers`.
    static func acceptBodySize(_ answers: some Sequence<EntryAnswer>) -> Int {
        answers.reduce(4) { $0 + minimumAnswerSize + $1.prefixDigest.count }
    }

    /// Whether `offer` or its Accept (every answer with a digest) could be longer than one
    /// frame: the sender then sets ``Offer/Flags/long`` (docs/PROTOCOL.md §3.9).
    public static func mayNeedParts(_ offer: Offer) -> Bool {
        let limit = ProtocolLimits.maximumMessageSize
        let answer = minimumAnswerSize + offer.algorithm.digestLength
        guard offer.entries.count <= (limit - 4) / answer else { return true }
        var bytes = 6
        for entry in offer.entries {
            bytes += minimumEntrySize + entry.linkTarget.utf8.count
            for component in entry.path { bytes += 2 + component.utf8.count }
            if bytes > limit { return true }
        }
        return false
    }
}

/// Puts an Offer or Accept sent in parts back together (docs/PROTOCOL.md §3.9), sans-IO: hand it
/// each frame as it arrives; it returns the message once the last part has come. The parts are
/// checked as they arrive (type, order, the 256 MiB bound) before their bytes are kept.
public struct MessageAssembler: Sendable {
    private var continued: UInt32?
    private var body: [UInt8] = []
    private let limit: Int

    public init() { self.init(limit: ProtocolLimits.maximumLongMessageSize) }

    /// With a lower bound than the protocol's, for tests.
    init(limit: Int) { self.limit = limit }

    /// Whether parts have come and the message is not complete yet.
    public var isPartial: Bool { continued != nil }

    /// Takes the next frame: the message it is or completes, or nil when it was a Continuation.
    public mutating func take(type: UInt32, body part: Data) throws(TransferError) -> Message? {
        guard type == MessageCodec.continuationType else {
            guard let continued else { return try MessageCodec.decode(type: type, body: [UInt8](part)) }
            guard type == continued else {
                throw TransferError(.malformed, "a \(Self.name(type)) frame among the parts of an \(Self.name(continued))")
            }
            try append(part)
            self.continued = nil
            defer { body = [] }
            return try MessageCodec.decode(type: type, body: body)
        }
        guard part.count > 4 else { throw TransferError(.malformed, "a Continuation of \(part.count) bytes") }
        let inner = part.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        guard MessageCodec.mayComeInParts(inner) else {
            throw TransferError(.malformed, "a Continuation of message type \(inner) (only an Offer or an Accept comes in parts)")
        }
        guard continued == nil || continued == inner else {
            throw TransferError(.malformed, "a Continuation of an \(Self.name(inner)) among the parts of an \(Self.name(continued!))")
        }
        continued = inner
        try append(part.dropFirst(4))
        return nil
    }

    private mutating func append(_ bytes: Data) throws(TransferError) {
        guard bytes.count <= limit - body.count else {
            throw TransferError(.limitExceeded, "an \(Self.name(continued ?? 0)) in parts longer than the \(limit)-byte limit")
        }
        body.append(contentsOf: bytes)
    }

    private static func name(_ type: UInt32) -> String {
        MessageType(rawValue: type).map { "\($0)" } ?? "type-\(type)"
    }
}
