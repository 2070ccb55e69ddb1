// libFuzzer target: the IVF and Y4M readers (Sources/QXferStream/MediaFiles.swift), which read
// whatever file or pipe `qxfer stream send --input` is given.
//
// Input: a whole file; "YUV4MPEG2" at the start selects the Y4M reader, anything else the IVF
// reader. Oracles beyond "never traps, never hangs, never allocates past libFuzzer's limit":
//  - every error is StreamError(.badInput) with a one-line message;
//  - IVF: the header and the frames read, written back in IVF layout, give exactly the bytes of
//    the input (all of it when no error came; a prefix of it when one did); no frame is larger
//    than IVFHeader.maximumFrameSize;
//  - Y4M: every picture has the header's picture size and counts as a keyframe; without an
//    error, the reader consumed the whole input.
//  - Y4M written back as `stream recv` does, with picture numbers that jump ahead (issue 66 §3):
//    the input's last bytes give each picture's number and arrival time; Y4MWriter (to
//    /dev/null), behind PlayoutBuffer and BoundedOutput at the header's rate, never writes more
//    repeated pictures than received ones, nor more than the stream's clock allows.
import Foundation

func expectBadInput(_ error: any Error) {
    guard let error = error as? StreamError, error.code == .badInput else { fatalError("unexpected error \(error)") }
    precondition(!error.message.contains("\n"), "a multi-line error message")
}

func checkIVF(_ input: Data) {
    var reader: IVFReader
    do {
        reader = try IVFReader(ByteInput(data: input))
    } catch {
        expectBadInput(error)
        return
    }
    var rebuilt = reader.header.bytes
    precondition(rebuilt == input.prefix(IVFHeader.size), "the header read is not the file's first 32 bytes")
    _ = reader.frameRate
    do {
        while let frame = try reader.next() {
            precondition(frame.payload.count <= IVFHeader.maximumFrameSize, "a frame past the size limit")
            var frameHeader = LittleEndianWriter()
            frameHeader.u32(UInt32(frame.payload.count))
            frameHeader.u64(frame.timestamp ?? 0)
            rebuilt += frameHeader.data + frame.payload
        }
        precondition(rebuilt == input, "the frames read do not rebuild the file")
    } catch {
        expectBadInput(error)
        precondition(input.starts(with: rebuilt), "the frames read before an error are not the file's start")
    }
}

func checkY4M(_ input: Data) {
    let source = ByteInput(data: input)
    var reader: Y4MReader
    do {
        reader = try Y4MReader(source)
    } catch {
        expectBadInput(error)
        return
    }
    let header = reader.header
    precondition(header.pictureSize > 0 && header.width > 0 && header.height > 0, "an empty picture size was accepted")
    precondition(input.starts(with: header.bytes.dropLast()), "the header line is not the file's first line")
    do {
        while let picture = try reader.next() {
            precondition(picture.payload.count == header.pictureSize && picture.isKeyframe, "a picture of the wrong size")
        }
        precondition(source.offset == input.count, "the reader stopped before the end without an error")
    } catch {
        expectBadInput(error)
    }
    if header.pictureSize <= 1 << 16 { writeWithGaps(header, script: [UInt8](input.suffix(48))) }
}

func writeWithGaps(_ header: Y4MHeader, script: [UInt8]) {
    guard var writer = try? Y4MWriter(output: ByteOutput(path: "/dev/null"), header: header.bytes) else {
        fatalError("a parsed Y4M header is refused by the writer, or /dev/null cannot be opened")
    }
    var playout = PlayoutBuffer()
    var output = BoundedOutput(bound: OutputBound(rate: header.frameRate))
    let start: UInt64 = 1 << 40
    var now = start, index: UInt64 = 0, received: UInt64 = 0
    var bytes = script[...]
    while bytes.count >= 2 {
        let jump = bytes.removeFirst(), timing = bytes.removeFirst()
        // Jumps of up to 2^(jump & 63): 1, 65 536, 2^63 pictures ahead.
        let (next, overflow) = index.addingReportingOverflow(UInt64(1) << UInt64(jump & 63))
        index = overflow ? .max : next
        now += UInt64(timing & 0x7F) * 10_000_000
        // Captured 10 s before the stream began, or now.
        let capture = timing & 0x80 != 0 ? start - 10_000_000_000 : now
        let frame = Frame(index: index, isKeyframe: true, captureTime: capture, deadline: .milliseconds(100), payload: Data(count: header.pictureSize))
        if playout.add(frame) { received += 1 }
        do { try output.write(playout.release(now: now), elapsed: now - start, to: &writer) } catch { fatalError("writing to /dev/null failed: \(error)") }
    }
    precondition(output.picturesFilled <= received, "more pictures repeated than received")
    precondition(output.picturesFilled <= output.bound.allowance(elapsed: now - start), "pictures repeated past the stream's clock")
    precondition(writer.picturesWritten <= output.picturesWritten, "the writer wrote more than the output counted")
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzMedia(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let input = size == 0 || data == nil ? Data() : Data(bytes: data!, count: size)
    if input.starts(with: Data("YUV4MPEG2".utf8)) { checkY4M(input) } else { checkIVF(input) }
    return 0
}
