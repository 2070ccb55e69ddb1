import Foundation
import Testing
@testable import QXferStream

/// IVF and Y4M readers and writers, the synthetic source, and hostile inputs.
@Suite struct MediaFileTests {
    /// An IVF file in memory: header plus frames of the given sizes (VP8 keyframe bit set on the first).
    static func ivf(frames: [Int], rate: UInt32 = 30, scale: UInt32 = 1, fourcc: String = "VP80") -> Data {
        var writer = LittleEndianWriter()
        writer.bytes(Array("DKIF".utf8))
        writer.u16(0); writer.u16(32)
        writer.bytes(Array(fourcc.utf8))
        writer.u16(320); writer.u16(240)
        writer.u32(rate); writer.u32(scale)
        writer.u32(UInt32(frames.count)); writer.u32(0)
        for (index, size) in frames.enumerated() {
            writer.u32(UInt32(size))
            writer.u64(UInt64(index))
            // VP8: bit 0 of the first byte clear on keyframes.
            if size > 0 { writer.bytes([index == 0 ? 0x10 : 0x11] + (1..<size).map { UInt8(truncatingIfNeeded: $0 &+ index) }) }
        }
        return writer.data
    }

    @Test func ivfRoundTripsByteForByte() throws {
        let file = Self.ivf(frames: [500, 20, 31, 0, 7])
        var reader = try IVFReader(ByteInput(data: file))
        #expect(reader.header.fourcc == "VP80" && reader.frameRate == FrameRate(numerator: 30))
        var frames: [Frame] = []
        while let next = try reader.next() {
            frames.append(Frame(index: UInt64(frames.count), isKeyframe: next.isKeyframe, captureTime: 0, deadline: .zero, payload: next.payload, timestamp: next.timestamp))
        }
        #expect(frames.map(\.payload.count) == [500, 20, 31, 0, 7])
        #expect(frames.map(\.isKeyframe) == [true, false, false, false, false])
        let scratch = try TemporaryDirectory()
        var writer = try IVFWriter(output: ByteOutput(path: scratch.file("out.ivf")), header: reader.containerHeader)
        for frame in frames { try writer.write(frame) }
        try writer.close()
        #expect(try Data(contentsOf: URL(fileURLWithPath: scratch.file("out.ivf"))) == file)
    }

    @Test func ivfPacesByItsTimeBase() throws {
        // A 1/1000 time base with pts in milliseconds: frame 3 at pts 3 → 3 ms.
        var reader = try IVFReader(ByteInput(data: Self.ivf(frames: [10, 10, 10, 10], rate: 1000, scale: 1)))
        var dues: [UInt64] = []
        while let next = try reader.next() { dues.append(next.dueTime) }
        #expect(dues == [0, 1_000_000, 2_000_000, 3_000_000])
        #expect(reader.frameRate == FrameRate(numerator: 30))  // 1000 "fps" is a time base, not a rate
    }

    @Test func hostileIVFFilesFailWithOneLine() throws {
        let good = Self.ivf(frames: [100, 100])
        var pastEnd = good
        pastEnd.removeLast(10)
        var hugeFrame = good
        hugeFrame.replaceSubrange(32..<36, with: [0xFF, 0xFF, 0xFF, 0x7F])
        let cases: [(Data, String)] = [
            (good.prefix(17), "truncated IVF header: 17 of 32 bytes"),
            (Data("RIFF".utf8) + good.dropFirst(4), "not an IVF file"),
            (pastEnd, "claims 100 bytes but the file ends after 90"),
            (good.prefix(32 + 112 + 5), "truncated IVF frame header"),
            (hugeFrame, "more than the"),
        ]
        for (data, message) in cases {
            let error = #expect(throws: StreamError.self) {
                var reader = try IVFReader(ByteInput(data: data))
                while try reader.next() != nil {}
            }
            #expect(error?.code == .badInput)
            #expect(error?.message.contains(message) == true, "\(error?.message ?? "nil") should say \(message)")
            #expect(error?.message.contains("\n") == false)
        }
    }

    static func y4m(width: Int = 8, height: Int = 4, frames: Int = 3) -> Data {
        var data = Data("YUV4MPEG2 W\(width) H\(height) F25:1 Ip A1:1 C420jpeg XYSCSS=420JPEG\n".utf8)
        for index in 0..<frames {
            data += Data("FRAME\n".utf8)
            data += Data((0..<(width * height * 3 / 2)).map { UInt8(truncatingIfNeeded: $0 * 7 + index) })
        }
        return data
    }

    @Test func y4mRoundTripsAndRepeatsAPictureForAGap() throws {
        let file = Self.y4m()
        var reader = try Y4MReader(ByteInput(data: file))
        #expect(reader.header.pictureSize == 48 && reader.frameRate == FrameRate(numerator: 25))
        var frames: [Frame] = []
        while let next = try reader.next() {
            frames.append(Frame(index: UInt64(frames.count), isKeyframe: true, captureTime: 0, deadline: .zero, payload: next.payload))
        }
        #expect(frames.count == 3)
        let scratch = try TemporaryDirectory()
        var writer = try Y4MWriter(output: ByteOutput(path: scratch.file("a.y4m")), header: reader.containerHeader)
        for frame in frames { try writer.write(frame) }
        try writer.close()
        #expect(try Data(contentsOf: URL(fileURLWithPath: scratch.file("a.y4m"))) == file)

        var gapped = try Y4MWriter(output: ByteOutput(path: scratch.file("b.y4m")), header: reader.containerHeader)
        try gapped.write(frames[0])
        try gapped.skip(1)
        try gapped.write(frames[2])
        try gapped.close()
        var back = try Y4MReader(ByteInput(path: scratch.file("b.y4m")))
        var pictures: [Data] = []
        while let next = try back.next() { pictures.append(next.payload) }
        #expect(pictures == [frames[0].payload, frames[0].payload, frames[2].payload])
    }

    @Test func hostileY4MFilesFailWithOneLine() {
        let good = Self.y4m()
        let cases: [(Data, String)] = [
            (Data("GARBAGE W8 H4\n".utf8), "not a Y4M file"),
            (Data("YUV4MPEG2 W0 H4 F25:1\n".utf8), "bad picture size"),
            (Data("YUV4MPEG2 W8 H4 F25:0\n".utf8), "bad frame rate"),
            (Data("YUV4MPEG2 W8 H4 Cfoo\n".utf8), "color space 'foo'"),
            (Data(repeating: 0x41, count: 5000), "longer than 1024"),
            (good.dropLast(5), "truncated"),
            (good.prefix(good.count - 48 - 6) + Data("FRAMX\n".utf8) + Data(count: 48), "does not start with FRAME"),
        ]
        for (data, message) in cases {
            let error = #expect(throws: StreamError.self) {
                var reader = try Y4MReader(ByteInput(data: data))
                while try reader.next() != nil {}
            }
            #expect(error?.message.contains(message) == true, "\(error?.message ?? "nil") should say \(message)")
        }
    }

    @Test func openSourceTellsFormatsApart() throws {
        let scratch = try TemporaryDirectory()
        try Self.ivf(frames: [10]).write(to: URL(fileURLWithPath: scratch.file("a.ivf")))
        try Self.y4m().write(to: URL(fileURLWithPath: scratch.file("a.y4m")))
        try Data("hello world".utf8).write(to: URL(fileURLWithPath: scratch.file("a.txt")))
        try Data("DK".utf8).write(to: URL(fileURLWithPath: scratch.file("short")))
        #expect(try openSource(path: scratch.file("a.ivf")).container == .ivf)
        #expect(try openSource(path: scratch.file("a.y4m")).container == .y4m)
        #expect(throws: StreamError.self) { try openSource(path: scratch.file("a.txt")) }
        #expect(throws: StreamError.self) { try openSource(path: scratch.file("short")) }
        #expect(throws: StreamError.self) { try openSource(path: scratch.file("missing")) }
    }

    @Test func syntheticSourceAveragesItsBitrateWithPeriodicKeyframes() throws {
        var source = SyntheticSource(frameRate: FrameRate(numerator: 30), bitsPerSecond: 4_000_000, keyframeInterval: 30)
        var bytes = 0
        var keyframes: [Int] = []
        for index in 0..<300 {
            let frame = try #require(try source.next())
            bytes += frame.payload.count
            if frame.isKeyframe { keyframes.append(index) }
            #expect(frame.dueTime == UInt64(index) * 1_000_000_000 / 30)
            #expect(frame.payload == SyntheticSource.payload(index: UInt64(index), size: frame.payload.count))
        }
        #expect(keyframes == Array(stride(from: 0, to: 300, by: 30)))
        let bitsPerSecond = Double(bytes * 8) / 10
        #expect(abs(bitsPerSecond - 4_000_000) / 4_000_000 < 0.03, "\(bitsPerSecond) bit/s")
    }

    @Test func keyframeDetection() {
        let vp9 = IVFHeader(fourcc: "VP90", width: 0, height: 0, timeRate: 30, timeScale: 1, frameCount: 0, bytes: Data())
        // frame_marker 10, profile 0 (00), show_existing 0, frame_type 0 (key) → 1000_0xxx
        #expect(vp9.isKeyframe(Data([0x82, 0x49])))
        #expect(!vp9.isKeyframe(Data([0x86])))  // frame_type 1
        let av1 = IVFHeader(fourcc: "AV01", width: 0, height: 0, timeRate: 30, timeScale: 1, frameCount: 0, bytes: Data())
        // temporal delimiter (type 2, has size, size 0), then a sequence header (type 1).
        #expect(av1.isKeyframe(Data([0x12, 0x00, 0x0A, 0x01, 0x00])))
        #expect(!av1.isKeyframe(Data([0x12, 0x00, 0x32, 0x01, 0x00])))  // frame OBU only
    }
}

/// A temporary folder removed when the value goes away.
final class TemporaryDirectory: Sendable {
    let path: String
    init() throws {
        let template = FileManager.default.temporaryDirectory.appendingPathComponent("qxfer-stream-XXXXXX").path
        var bytes = Array(template.utf8CString)
        guard let made = bytes.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw StreamError(.output, "mkdtemp failed")
        }
        path = String(cString: made)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
    func file(_ name: String) -> String { path + "/" + name }
}
