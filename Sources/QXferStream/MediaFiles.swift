import FoundationEssentials
import Glibc
#if canImport(SafeOutput)  // fuzz/run.sh compiles OutputFile's source into its one module
import SafeOutput
#endif

/// One frame as a source yields it, before it is stamped with a capture time.
public struct SourceFrame: Sendable, Hashable {
    /// The encoded frame (or raw picture).
    public var payload: Data
    /// Whether it decodes on its own.
    public var isKeyframe: Bool
    /// The container's presentation timestamp; nil when the container has none.
    public var timestamp: UInt64?
    /// When the frame is due, in nanoseconds from the start of the source: paces playback.
    public var dueTime: UInt64

    public init(payload: Data, isKeyframe: Bool, timestamp: UInt64?, dueTime: UInt64) {
        self.payload = payload
        self.isKeyframe = isKeyframe
        self.timestamp = timestamp
        self.dueTime = dueTime
    }
}

/// Where frames come from: the synthetic generator or a file.
public protocol FrameSource {
    /// The container kind, so the receiver writes the same.
    var container: ContainerKind { get }
    /// The container header to reproduce at the receiver.
    var containerHeader: Data { get }
    /// Frames per second.
    var frameRate: FrameRate { get }
    /// The next frame; nil at the end.
    mutating func next() throws -> SourceFrame?
}

/// Reads exact byte counts from a file or standard input, telling a clean end from a short read.
public final class ByteInput {
    /// The descriptor read from; -1 for bytes given in memory.
    private let descriptor: Int32
    private let closesDescriptor: Bool
    private let path: String
    private var buffer = Data()
    /// Bytes consumed so far (for error messages).
    public private(set) var offset = 0

    /// Opens a file, or standard input for "-".
    public init(path: String) throws {
        self.path = path == "-" ? "standard input" : path
        if path == "-" {
            descriptor = STDIN_FILENO
            closesDescriptor = false
        } else {
            let opened = open(path, O_RDONLY | O_CLOEXEC)
            guard opened >= 0 else {
                throw StreamError(.badInput, "cannot open \(path) for reading: \(String(cString: strerror(errno)))")
            }
            descriptor = opened
            closesDescriptor = true
        }
    }

    /// Reads from bytes in memory (tests, small inputs).
    public init(data: Data) {
        descriptor = -1
        closesDescriptor = false
        path = "memory"
        buffer = data
    }

    deinit { if closesDescriptor { close(descriptor) } }

    /// Up to `count` bytes: fewer only at the end of the input.
    public func read(upTo count: Int) throws -> Data {
        while buffer.count < count {
            // In pieces of at most 4 MiB: a header claiming a huge picture or frame must not
            // make a short file allocate that much before it runs out.
            let chunk = try readChunk(upTo: min(max(count - buffer.count, 64 << 10), 4 << 20))
            if chunk.isEmpty { break }
            buffer.append(contentsOf: chunk)
        }
        let taken = buffer.prefix(count)
        buffer.removeFirst(taken.count)
        offset += taken.count
        return Data(taken)
    }

    /// Up to `limit` bytes from the descriptor; none at its end.
    private func readChunk(upTo limit: Int) throws -> [UInt8] {
        guard descriptor >= 0 else { return [] }
        var chunk = [UInt8](repeating: 0, count: limit)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, limit) }
            if n >= 0 {
                chunk.removeLast(limit - n)
                return chunk
            }
            guard errno == EINTR else {
                throw StreamError(.badInput, "cannot read \(path): \(String(cString: strerror(errno)))")
            }
        }
    }

    /// One line up to "\n" (excluded), at most `limit` bytes; nil at a clean end.
    public func readLine(limit: Int) throws -> Data? {
        var line = Data()
        while true {
            let byte = try read(upTo: 1)
            if byte.isEmpty { return line.isEmpty ? nil : line }
            if byte[byte.startIndex] == 0x0A { return line }
            line.append(byte)
            if line.count > limit { throw StreamError(.badInput, "a header line longer than \(limit) bytes") }
        }
    }
}

// MARK: - IVF

/// IVF, the container of VP8, VP9 and AV1 test streams: a 32-byte file header ("DKIF", version 0,
/// header size, fourcc, width, height, time base denominator and numerator, frame count), then
/// per frame a 12-byte header (size u32, pts u64, little-endian) and the frame.
public struct IVFHeader: Sendable, Hashable {
    /// The codec: VP80, VP90, AV01 (QXSY for synthetic frames).
    public var fourcc: String
    /// The picture size in pixels.
    public var width: UInt16
    public var height: UInt16
    /// Time base = timeScale / timeRate seconds per pts unit (IVF stores rate, then scale).
    public var timeRate: UInt32
    public var timeScale: UInt32
    /// The frame count the header declares (often 0 for live captures).
    public var frameCount: UInt32
    /// The header exactly as read.
    public var bytes: Data

    /// The header size.
    public static let size = 32
    /// The largest frame accepted (a 4K keyframe is a few MiB).
    public static let maximumFrameSize = 32 << 20

    /// Parses the 32-byte file header.
    public static func parse(_ data: Data) throws -> IVFHeader {
        guard data.count >= size else {
            throw StreamError(.badInput, "truncated IVF header: \(data.count) of \(size) bytes")
        }
        let bytes = [UInt8](data.prefix(size))
        guard bytes[0..<4] == [0x44, 0x4B, 0x49, 0x46] else { throw StreamError(.badInput, "not an IVF file: it does not start with DKIF") }
        func u16(_ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
        func u32(_ at: Int) -> UInt32 { UInt32(u16(at)) | UInt32(u16(at + 2)) << 16 }
        guard u16(4) == 0 else { throw StreamError(.badInput, "unsupported IVF version \(u16(4))") }
        guard u16(6) == UInt16(size) else { throw StreamError(.badInput, "IVF header size \(u16(6)), expected \(size)") }
        let fourcc = String(decoding: bytes[8..<12], as: UTF8.self)
        guard u32(16) > 0, u32(20) > 0 else { throw StreamError(.badInput, "IVF header has a zero time base") }
        return IVFHeader(
            fourcc: fourcc, width: u16(12), height: u16(14), timeRate: u32(16), timeScale: u32(20),
            frameCount: u32(24), bytes: Data(bytes))
    }

    /// A header for frames from the synthetic source (fourcc "QXSY": not decodable video).
    public static func synthetic(frameRate: FrameRate) -> Data {
        var writer = LittleEndianWriter()
        writer.bytes(Array("DKIF".utf8))
        writer.u16(0); writer.u16(UInt16(size))
        writer.bytes(Array("QXSY".utf8))
        writer.u16(0); writer.u16(0)
        writer.u32(frameRate.numerator); writer.u32(frameRate.denominator)
        writer.u32(0); writer.u32(0)
        return writer.data
    }

    /// Whether a frame is a keyframe, from the first bytes of its bitstream.
    ///
    /// VP8: bit 0 of the first byte is 0 on keyframes (RFC 6386 section 9.1). VP9: the
    /// uncompressed header's frame_type bit after the marker, profile and show_existing_frame
    /// bits. AV1: a sequence header OBU (type 1) in the temporal unit, which encoders emit with
    /// each keyframe. Unknown codecs: every frame counts as a keyframe.
    public func isKeyframe(_ frame: Data) -> Bool {
        guard let first = frame.first else { return false }
        switch fourcc {
        case "VP80": return first & 1 == 0
        case "VP90":
            // frame_marker(2) profile_low(1) profile_high(1) [reserved(1) if profile 3] show_existing(1) frame_type(1)
            let profile = (first >> 5 & 1) | (first >> 4 & 1) << 1
            var bit = 4
            if profile == 3 { bit -= 1 }
            if first >> UInt8(bit - 1) & 1 == 1 { return false }  // show_existing_frame
            return first >> UInt8(bit - 2) & 1 == 0
        case "AV01":
            var offset = frame.startIndex
            while offset < frame.endIndex {
                let header = frame[offset]
                let type = header >> 3 & 0x0F
                if type == 1 { return true }
                let hasExtension = header & 0x04 != 0, hasSize = header & 0x02 != 0
                offset += 1 + (hasExtension ? 1 : 0)
                guard hasSize else { return false }
                var size = 0, shift = 0
                while offset < frame.endIndex, shift < 56 {
                    let byte = frame[offset]
                    offset += 1
                    size |= Int(byte & 0x7F) << shift
                    shift += 7
                    if byte & 0x80 == 0 { break }
                }
                offset += size
            }
            return false
        default: return true
        }
    }
}

/// Reads frames from an IVF file or stream.
public struct IVFReader: FrameSource {
    /// The file header.
    public let header: IVFHeader
    private let input: ByteInput
    private var index = 0

    public var container: ContainerKind { .ivf }
    public var containerHeader: Data { header.bytes }
    /// The header's time base when it is a frame rate (≤ 240 per second), else 30.
    public var frameRate: FrameRate {
        let rate = Double(header.timeRate) / Double(header.timeScale)
        return rate > 0 && rate <= 240 ? FrameRate(numerator: header.timeRate, denominator: header.timeScale) : FrameRate(numerator: 30)
    }

    public init(_ input: ByteInput) throws {
        self.input = input
        header = try IVFHeader.parse(try input.read(upTo: IVFHeader.size))
    }

    public mutating func next() throws -> SourceFrame? {
        let frameHeader = [UInt8](try input.read(upTo: 12))
        if frameHeader.isEmpty { return nil }
        guard frameHeader.count == 12 else {
            throw StreamError(.badInput, "truncated IVF frame header: frame \(index) at byte \(input.offset - frameHeader.count) has \(frameHeader.count) of 12 bytes")
        }
        let size = Int(frameHeader[0..<4].reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        let pts = frameHeader[4..<12].reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        guard size <= IVFHeader.maximumFrameSize else {
            throw StreamError(.badInput, "IVF frame \(index) claims \(size) bytes, more than the \(IVFHeader.maximumFrameSize)-byte limit")
        }
        let payload = try input.read(upTo: size)
        guard payload.count == size else {
            throw StreamError(.badInput, "IVF frame \(index) claims \(size) bytes but the file ends after \(payload.count)")
        }
        // Pace by pts in the header's time base: files with a 1/1000 time base pace right too.
        let due = pts &* UInt64(header.timeScale) &* 1_000_000_000 / UInt64(header.timeRate)
        defer { index += 1 }
        return SourceFrame(payload: payload, isKeyframe: header.isKeyframe(payload), timestamp: pts, dueTime: due)
    }
}

// MARK: - Y4M

/// YUV4MPEG2: a text header line ("YUV4MPEG2 W320 H240 F30:1 Ip A1:1 C420jpeg"), then per
/// picture a line starting "FRAME" and the raw planes.
public struct Y4MHeader: Sendable, Hashable {
    /// The picture size in pixels, the frame rate and the color space (`C`, default 420jpeg).
    public var width: Int
    public var height: Int
    public var frameRate: FrameRate
    public var colorSpace: String
    /// Bytes per picture, from the size and the color space.
    public var pictureSize: Int
    /// The header line including its newline.
    public var bytes: Data

    /// Parses the header line (without its newline).
    public static func parse(line: Data) throws -> Y4MHeader {
        guard let text = String(data: line, encoding: .utf8), text.hasPrefix("YUV4MPEG2 ") || text == "YUV4MPEG2" else {
            throw StreamError(.badInput, "not a Y4M file: the header does not start with YUV4MPEG2")
        }
        var width = 0, height = 0, rate = FrameRate(numerator: 25), colorSpace = "420jpeg"
        for token in text.split(separator: " ").dropFirst() {
            let value = token.dropFirst()
            switch token.first {
            case "W": width = Int(value) ?? -1
            case "H": height = Int(value) ?? -1
            case "F":
                let parts = value.split(separator: ":").compactMap { UInt32($0) }
                guard parts.count == 2, parts[0] > 0, parts[1] > 0 else { throw StreamError(.badInput, "Y4M header has a bad frame rate '\(token)'") }
                rate = FrameRate(numerator: parts[0], denominator: parts[1])
            case "C": colorSpace = String(value)
            default: break  // interlacing, aspect, comments
            }
        }
        guard width > 0, height > 0, width <= 16384, height <= 16384 else {
            throw StreamError(.badInput, "Y4M header has a bad picture size \(width)x\(height)")
        }
        let luma = width * height, chroma420 = ((width + 1) / 2) * ((height + 1) / 2), chroma422 = ((width + 1) / 2) * height
        let samples: Int
        switch colorSpace.prefix(3) {
        case "420": samples = luma + 2 * chroma420
        case "422": samples = luma + 2 * chroma422
        case "444": samples = luma * 3
        case "mon": samples = luma
        default: throw StreamError(.badInput, "Y4M color space '\(colorSpace)' is not supported")
        }
        let wide = colorSpace.contains("p1") || colorSpace == "mono16"  // 10, 12, 14, 16 bits: two bytes a sample
        return Y4MHeader(
            width: width, height: height, frameRate: rate, colorSpace: colorSpace,
            pictureSize: samples * (wide ? 2 : 1), bytes: line + Data([0x0A]))
    }
}

/// Reads pictures from a Y4M file or stream; each is a keyframe.
public struct Y4MReader: FrameSource {
    /// The header line, parsed.
    public let header: Y4MHeader
    private let input: ByteInput
    private var index: UInt64 = 0

    public var container: ContainerKind { .y4m }
    public var containerHeader: Data { header.bytes }
    public var frameRate: FrameRate { header.frameRate }

    public init(_ input: ByteInput) throws {
        self.input = input
        guard let line = try input.readLine(limit: 1024) else { throw StreamError(.badInput, "empty Y4M input") }
        header = try Y4MHeader.parse(line: line)
    }

    public mutating func next() throws -> SourceFrame? {
        guard let line = try input.readLine(limit: 1024) else { return nil }
        guard line.starts(with: Data("FRAME".utf8)) else {
            throw StreamError(.badInput, "Y4M picture \(index) does not start with FRAME")
        }
        let picture = try input.read(upTo: header.pictureSize)
        guard picture.count == header.pictureSize else {
            throw StreamError(.badInput, "Y4M picture \(index) has \(picture.count) of \(header.pictureSize) bytes: the file is truncated")
        }
        defer { index += 1 }
        return SourceFrame(payload: picture, isKeyframe: true, timestamp: nil, dueTime: header.frameRate.dueTime(ofFrame: index))
    }
}

// MARK: - Synthetic

/// Frames sized like encoded video: a keyframe every `keyframeInterval` frames, six times the
/// size of the frames between, which vary by ±10 %, averaging `bitsPerSecond`.
///
/// Payloads are deterministic (the frame index, then a pattern derived from it), so a receiver
/// can check them byte for byte.
public struct SyntheticSource: FrameSource {
    /// Frames per second, average bit rate, and frames from one keyframe to the next.
    public let frameRate: FrameRate
    public let bitsPerSecond: Int
    public let keyframeInterval: Int
    /// Keyframe size over the average in-between frame size.
    public static let keyframeRatio = 6
    private var index: UInt64 = 0
    private var random: UInt64

    public var container: ContainerKind { .synthetic }
    public var containerHeader: Data { IVFHeader.synthetic(frameRate: frameRate) }

    public init(frameRate: FrameRate, bitsPerSecond: Int, keyframeInterval: Int = 30, seed: UInt64 = 1) {
        precondition(bitsPerSecond > 0 && keyframeInterval > 0)
        self.frameRate = frameRate
        self.bitsPerSecond = bitsPerSecond
        self.keyframeInterval = keyframeInterval
        self.random = seed | 1
    }

    /// The size of an in-between frame on average, so the whole averages the bit rate.
    public var deltaFrameSize: Int {
        let perFrame = Double(bitsPerSecond) / 8 / frameRate.perSecond
        let n = Double(keyframeInterval)
        return max(16, Int(perFrame * n / (Double(Self.keyframeRatio) + n - 1)))
    }

    public mutating func next() throws -> SourceFrame? {
        let isKeyframe = index % UInt64(keyframeInterval) == 0
        var size = deltaFrameSize
        if isKeyframe {
            size *= Self.keyframeRatio
        } else {
            random ^= random << 13; random ^= random >> 7; random ^= random << 17  // xorshift64
            size = size * (90 + Int(random % 21)) / 100
        }
        defer { index += 1 }
        return SourceFrame(
            payload: Self.payload(index: index, size: size), isKeyframe: isKeyframe, timestamp: index,
            dueTime: frameRate.dueTime(ofFrame: index))
    }

    /// The bytes of synthetic frame `index`: its index (big-endian), then `index &+ offset`.
    public static func payload(index: UInt64, size: Int) -> Data {
        var bytes = [UInt8](repeating: 0, count: max(size, 8))
        for shift in 0..<8 { bytes[shift] = UInt8(truncatingIfNeeded: index >> UInt64(56 - 8 * shift)) }
        let seed = UInt8(truncatingIfNeeded: index &* 31)
        for offset in 8..<bytes.count { bytes[offset] = seed &+ UInt8(truncatingIfNeeded: offset) }
        return Data(bytes)
    }
}

// MARK: - Sinks

/// Writes a stream's bytes to where the user pointed `--output`, never replacing it: a regular
/// file is written beside it and renamed into place when the stream ends; a terminal, a device
/// such as /dev/null, a named pipe (its reader sees frames live) or a socket is written directly;
/// `-` is standard output; a folder is refused (see `SafeOutput.OutputFile`).
public final class ByteOutput {
    private let file: OutputFile

    /// Opens `path` for the stream ("-" for standard output). Opening a named pipe waits for
    /// its reader.
    public init(path: String) throws {
        do { file = try OutputFile(path: path) } catch { throw StreamError(.output, error.message) }
    }

    /// Appends bytes.
    public func write(_ data: Data) throws {
        // Written from Data's own storage: no copy of each frame on the way out.
        var failure: OutputError?
        data.withUnsafeBytes { raw in
            do throws(OutputError) { try file.write(raw) } catch { failure = error }
        }
        if let failure { throw StreamError(.output, failure.message) }
    }

    /// Overwrites bytes at an offset, if the output is a file (IVF's frame count).
    public func patch(_ data: Data, at offset: UInt64) throws {
        guard let position = Int64(exactly: offset) else { return }
        do { try file.patch(Array(data), at: position) } catch { throw StreamError(.output, error.message) }
    }

    /// Ends the output: a file gets its name, anything else is closed (standard output stays open).
    public func close() throws {
        do { try file.finish() } catch { throw StreamError(.output, error.message) }
    }
}

/// Writes IVF: the sender's file header, then frames with their pts. After a gap it waits for
/// the next keyframe, since frames between depend on the one lost; the frame count in the
/// header is corrected at the end when the output is a file.
public struct IVFWriter: FrameSink {
    private let output: ByteOutput
    private var written: UInt32 = 0
    private var needsKeyframe = false
    /// Frames left out of the file because an earlier frame was missing.
    public private(set) var skippedForKeyframe = 0

    public init(output: ByteOutput, header: Data) throws {
        guard header.count == IVFHeader.size else { throw StreamError(.malformed, "the sender's IVF header has \(header.count) bytes") }
        self.output = output
        try output.write(header)
    }

    public mutating func write(_ frame: Frame) throws {
        if needsKeyframe && !frame.isKeyframe {
            skippedForKeyframe += 1
            return
        }
        needsKeyframe = false
        var writer = LittleEndianWriter()
        writer.u32(UInt32(frame.payload.count))
        writer.u64(frame.timestamp)
        try output.write(writer.data + frame.payload)
        // The header's count is 32 bits; a longer stream (from the network) keeps the maximum.
        if written < .max { written += 1 }
    }

    public mutating func skip(_ index: UInt64) throws { needsKeyframe = true }

    public mutating func close() throws {
        var count = LittleEndianWriter()
        count.u32(written)
        try output.patch(count.data, at: 24)
        try output.close()
    }
}

/// Writes Y4M: the sender's header line, then each picture; a missing picture repeats the
/// previous one, so the timeline keeps its length (within the stream's ``OutputBound``: past
/// it, a missing picture is left out and the timeline shortens).
public struct Y4MWriter: FrameSink {
    private let output: ByteOutput
    private var previous: Data?
    private let pictureSize: Int
    /// Pictures written, received and repeated.
    public private(set) var picturesWritten: UInt64 = 0
    /// Missing pictures left out rather than repeated.
    public private(set) var picturesLeftOut: UInt64 = 0
    public var fillsGaps: Bool { true }

    public init(output: ByteOutput, header: Data) throws {
        let line = header.last == 0x0A ? header.dropLast() : header[...]
        pictureSize = try Y4MHeader.parse(line: Data(line)).pictureSize
        self.output = output
        try output.write(header)
    }

    public mutating func write(_ frame: Frame) throws {
        guard frame.payload.count == pictureSize else {
            throw StreamError(.malformed, "a \(frame.payload.count)-byte picture in a stream of \(pictureSize)-byte pictures")
        }
        try output.write(Data("FRAME\n".utf8) + frame.payload)
        previous = frame.payload
        if picturesWritten < .max { picturesWritten += 1 }
    }

    public mutating func skip(_ index: UInt64) throws {
        guard let previous else { return }
        try output.write(Data("FRAME\n".utf8) + previous)
        if picturesWritten < .max { picturesWritten += 1 }
    }

    public mutating func leaveOut(_ index: UInt64) throws {
        if picturesLeftOut < .max { picturesLeftOut += 1 }
    }

    public mutating func close() throws { try output.close() }
}

/// Makes the sink for what the sender announced.
public func makeSink(for hello: StreamHello, output: ByteOutput) throws -> any FrameSink {
    switch hello.container {
    case .ivf, .synthetic: try IVFWriter(output: output, header: hello.containerHeader)
    case .y4m: try Y4MWriter(output: output, header: hello.containerHeader)
    }
}

/// Opens the source for a path: IVF or Y4M by their magic bytes.
public func openSource(path: String) throws -> any FrameSource {
    let input = try ByteInput(path: path)
    let magic = try input.read(upTo: 4)
    let rest = ByteInputPrefix(magic: magic, input: input)
    if magic == Data("DKIF".utf8) { return try IVFReader(rest.input) }
    if magic == Data("YUV4".utf8) { return try Y4MReader(rest.input) }
    if magic.count < 4 { throw StreamError(.badInput, "\(path) is too short to be IVF or Y4M (\(magic.count) bytes)") }
    throw StreamError(.badInput, "\(path) is neither IVF (DKIF) nor Y4M (YUV4MPEG2)")
}

/// Puts peeked bytes back in front of an input.
struct ByteInputPrefix {
    let input: ByteInput
    init(magic: Data, input: ByteInput) {
        input.unread(magic)
        self.input = input
    }
}

extension ByteInput {
    func unread(_ data: Data) {
        buffer = data + buffer
        offset -= data.count
    }
}

struct LittleEndianWriter {
    var data = Data()
    mutating func u16(_ value: UInt16) { withUnsafeBytes(of: value.littleEndian) { data.append(contentsOf: $0) } }
    mutating func u32(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { data.append(contentsOf: $0) } }
    mutating func u64(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { data.append(contentsOf: $0) } }
    mutating func bytes(_ value: [UInt8]) { data.append(contentsOf: value) }
}
