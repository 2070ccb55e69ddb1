import FoundationEssentials
import Glibc
import QXfer

/// qxfer/1 messages over any `TLV { … }` connection or stream of the public API: the TLV
/// framer carries exactly the protocol's frames (type UInt32, length UInt32, body), bounds the
/// length before allocating, and the codec checks everything inside.
extension NetworkConnection where Stack: TLVStack {
    /// Sends one message: an Offer or Accept longer than a frame in parts (docs/PROTOCOL.md §3.9).
    func send(_ message: Message) async throws {
        for frame in MessageCodec.frames(of: message) {
            try await send(frame.body, type: frame.type)
        }
    }

    /// Sends one message, as ``send(_:)`` does, within `pace.limit(for:)` its length in frames.
    /// A peer that takes it slower — reading a little at a time, so that its window moves and
    /// TCP_USER_TIMEOUT never fires — has the connection closed with a `cancelled` error, which
    /// is thrown; nothing of this connection then waits on it any longer.
    func send(_ message: Message, within pace: PeerPace) async throws {
        let frames = MessageCodec.frames(of: message)
        let bytes = frames.reduce(0) { $0 + MessageCodec.headerSize + $1.body.count }
        let limit = pace.limit(for: bytes)
        let name = "\(message.type)"
        let late = TransferError(
            .cancelled,
            "the peer did not take the \(name.prefix(1).uppercased() + name.dropFirst()) (\(bytes) bytes) within \(limit.shownInSeconds): it reads slower than \(pace.rateDescription)")
        try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                for frame in frames { try await self.send(frame.body, type: frame.type) }
                return true
            }
            group.addTask {
                try await Task.sleep(for: limit)
                return false
            }
            defer { group.cancelAll() }
            guard try await group.next()! else {
                // At once, not once what was sent is delivered (that is what the peer holds
                // back): over QUIC the peer learns why; the blocked send then fails.
                await close(errorCode: UInt64(late.code.rawValue), reason: late.message, within: .zero)
                throw late
            }
        }
    }

    /// Sends one FileData frame of `entry` at `offset`: up to `capacity` bytes of `file` read
    /// straight into the buffer the transport takes (no copy of the chunk on its way out);
    /// `payload` sees them before they go (the sender's digest). Returns how many were read: 0
    /// at the end of the file, and then nothing is sent. `shown` names the file in a read error.
    func sendFileData(
        entry: UInt32, offset: UInt64, from file: Descriptor, shown: String, capacity: Int, sequential: Bool,
        payload: (UnsafeRawBufferPointer) -> Void
    ) async throws -> Int {
        var count = 0
        do {
            try await send(type: MessageType.fileData.rawValue, capacity: FileDataBody.headerSize + capacity) { body in
                count = try FileDataBody.fill(body, entry: entry, offset: offset, from: file, shown: shown, sequential: sequential)
                guard count > 0 else { throw EndOfFile() }
                payload(UnsafeRawBufferPointer(rebasing: body[FileDataBody.headerSize..<FileDataBody.headerSize + count]))
                return FileDataBody.headerSize + count
            }
        } catch is EndOfFile {
            return 0
        }
        return count
    }

    /// Sends one Batch built by ``BatchBody``.
    func send(_ batch: BatchBody) async throws {
        try await send(batch.bytes, type: MessageType.batch.rawValue)
    }

    /// The next message, or nil when the peer finished the stream between messages. A frame
    /// longer than the limit is `limit-exceeded`, which the caller reports to the peer in an
    /// Error before closing (docs/PROTOCOL.md §2). `arrived` is told the frame's length as it
    /// comes, before it is decoded (the receiver's clock of the sender).
    func receiveMessage(arrived: (Int) -> Void = { _ in }) async throws -> Message? {
        guard let frame = try await receiveFrame() else { return nil }
        arrived(frame.content.count + MessageCodec.headerSize)
        return try MessageCodec.decode(type: frame.metadata.type, body: frame.content)
    }

    /// The next message where an Offer or Accept may come in parts (docs/PROTOCOL.md §3.9):
    /// the parts are put together. `admit` is called with each frame's length as it arrives,
    /// before the frame is kept; once it throws, the message's other parts are read and
    /// dropped, and its error is thrown when the message ends (a sender sends every part before
    /// it reads an answer, so it hears the refusal instead of a connection cut off). The peer
    /// finishing the stream between parts is `malformed`. `arrived` is told each frame's length,
    /// refused or not (the receiver's clock for the whole message).
    func receiveMessageInParts(arrived: (Int) -> Void = { _ in }, admit: (Int) throws -> Void = { _ in }) async throws -> Message? {
        var assembler = MessageAssembler()
        var refusal: (any Error)?
        while let frame = try await receiveFrame() {
            arrived(frame.content.count)
            if refusal == nil {
                do { try admit(frame.content.count) } catch { refusal = error }
            }
            if let refusal {
                guard frame.metadata.type == MessageCodec.continuationType else { throw refusal }
                continue
            }
            if let message = try assembler.take(type: frame.metadata.type, body: frame.content) { return message }
        }
        if let refusal { throw refusal }
        guard !assembler.isPartial else { throw TransferError(.malformed, "the stream ended between the parts of a message") }
        return nil
    }

    private func receiveFrame() async throws -> (content: Data, metadata: TLVMetadata)? {
        do {
            return try await receive()
        } catch let error as QXferError where error.code == .endOfStream {
            return nil
        } catch let error as QXferError where error.code == .messageTooLarge {
            throw TransferError(.limitExceeded, error.message)
        }
    }
}

/// Nothing left to read: the FileData is not sent.
private struct EndOfFile: Error {}

/// A FileData body (docs/PROTOCOL.md §3.3) written in place: a 12-byte header (entry,
/// offset), then up to one chunk read straight from the file.
enum FileDataBody {
    static let headerSize = 12

    /// Writes the header into `body` and reads up to `body.count - headerSize` bytes of `file`
    /// at `offset` after it; returns the number read (0 at the end of the file). `sequential`
    /// reads with `read` (standard input, kernel files) instead of `pread`.
    static func fill(
        _ body: UnsafeMutableRawBufferPointer, entry: UInt32, offset: UInt64, from file: Descriptor, shown: String, sequential: Bool
    ) throws(TransferError) -> Int {
        precondition(body.count > headerSize, "a FileData body needs room for its header and a byte")
        body.storeBytes(of: entry.bigEndian, toByteOffset: 0, as: UInt32.self)
        body.storeBytes(of: offset.bigEndian, toByteOffset: 4, as: UInt64.self)
        let start = body.baseAddress! + headerSize
        let capacity = body.count - headerSize
        var n: Int
        var err: Int32 = 0
        repeat {
            n = sequential ? read(file.fd, start, capacity) : pread(file.fd, start, capacity, off_t(offset))
            err = errno
        } while n < 0 && err == EINTR
        guard n >= 0 else { throw TransferError.posix("cannot read", "'\(shown)'", errno: err) }
        return n
    }
}

/// A Batch body (docs/PROTOCOL.md §3.6) assembled in one buffer: whole frames one after
/// another, a small file's bytes read straight into its FileData frame.
struct BatchBody {
    private(set) var bytes = Data(capacity: 1 << 20 + 64 << 10)
    /// Where the payload of the last FileData appended lies in ``bytes``.
    private var lastPayload: Range<Int> = 0..<0

    /// Appends a whole frame.
    mutating func append(_ message: Message) {
        bytes.append(contentsOf: MessageCodec.encodeFrame(message))
    }

    /// Appends a FileData frame of `entry` at offset 0 holding the first `size` bytes of `file`
    /// (1 … ``ProtocolLimits/maximumChunkSize``); returns how many were read (fewer when the
    /// file shrank, and the caller then ends it with a Failed; none: no frame is appended).
    mutating func appendFileData(entry: UInt32, from file: Descriptor, shown: String, size: Int) throws(TransferError) -> Int {
        precondition(size > 0 && size <= ProtocolLimits.maximumChunkSize, "a FileData of \(size) bytes")
        let start = bytes.count
        let header = MessageCodec.headerSize + FileDataBody.headerSize
        bytes.count = start + header + size
        var done = 0
        var err: Int32 = 0
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: MessageType.fileData.rawValue.bigEndian, toByteOffset: start, as: UInt32.self)
            raw.storeBytes(of: entry.bigEndian, toByteOffset: start + MessageCodec.headerSize, as: UInt32.self)
            raw.storeBytes(of: UInt64(0).bigEndian, toByteOffset: start + MessageCodec.headerSize + 4, as: UInt64.self)
            while done < size {
                let n = pread(file.fd, raw.baseAddress! + start + header + done, size - done, off_t(done))
                if n < 0 {
                    err = errno
                    if err == EINTR { continue }
                    return
                }
                if n == 0 { return }
                done += n
            }
        }
        guard err == 0 || err == EINTR else { throw TransferError.posix("cannot read", "'\(shown)'", errno: err) }
        guard done > 0 else {
            bytes.count = start  // no empty FileData (malformed): the frame goes
            return 0
        }
        bytes.count = start + header + done
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(FileDataBody.headerSize + done).bigEndian, toByteOffset: start + 4, as: UInt32.self)
        }
        lastPayload = (start + header)..<(start + header + done)
        return done
    }

    /// The file bytes of the last FileData appended.
    func withLastPayload<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        bytes.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[lastPayload])) }
    }
}

extension MessageCodec {
    /// Decodes a body received as `Data` (what the TLV framer returns). FileData, the bulk of
    /// every transfer, is taken apart in place: its bytes are a slice of `body`, not a copy.
    public static func decode(type: UInt32, body: Data) throws(TransferError) -> Message {
        let header = FileDataBody.headerSize
        if type == MessageType.fileData.rawValue, body.count > header, body.count - header <= ProtocolLimits.maximumChunkSize {
            let (entry, offset) = body.withUnsafeBytes {
                (UInt32(bigEndian: $0.loadUnaligned(as: UInt32.self)), UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: 4, as: UInt64.self)))
            }
            let count = body.count - header
            guard offset <= UInt64.max - UInt64(count) else { throw TransferError(.malformed, "FileData offset overflows") }
            return .fileData(FileData(entry: entry, offset: offset, bytes: body[(body.startIndex + header)...]))
        }
        // Everything else, including malformed FileData, takes the general path and its errors.
        return try decode(type: type, body: [UInt8](body))
    }
}

extension NetworkConnection where Stack: TLVStack {
    /// Runs one side of a transfer. On failure the peer learns why in an Error message (unless
    /// it told us, or was told already), and the connection closes either way.
    func endingOnError<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let communicated as AlreadyCommunicated {
            await closeBeforeLeaving()
            throw communicated.error
        } catch let error as TransferError {
            await sendFinalError(error)
            throw error
        } catch {
            await closeBeforeLeaving()
            throw error
        }
    }

    /// Tells the peer why we stop (best effort, briefly), then closes.
    func sendFinalError(_ error: TransferError) async {
        _ = try? await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await self.send(.error(Refusal(error))) }
            group.addTask { try await Task.sleep(for: .seconds(2)) }
            try await group.next()
            group.cancelAll()
        }
        await closeBeforeLeaving(errorCode: UInt64(error.code.rawValue), reason: error.message)
    }

    /// Closes the connection once what was sent is delivered (or `grace` has passed), and
    /// returns when the close has left: the program may exit next, and over QUIC an exit before
    /// that would leave the peer waiting for its idle timeout (docs/PROTOCOL.md §2).
    func closeBeforeLeaving(errorCode: UInt64 = 0, reason: String = "", grace: Duration = .seconds(3)) async {
        await close(errorCode: errorCode, reason: reason, within: grace)
    }
}
