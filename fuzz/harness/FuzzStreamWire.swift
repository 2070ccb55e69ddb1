// libFuzzer target: what `qxfer stream recv` reads from the network — control-stream messages
// (MessageDecoder, Sources/QXferStream/WireFormat.swift), realtime datagrams
// (RealtimeDatagram.decode) and their reassembly with FEC and NACKs (FrameAssembler,
// RealtimeDatagrams.swift, ReedSolomon.swift).
//
// The first input byte picks the mode; oracles beyond "never traps, never hangs":
//  0  control stream: the rest fed to MessageDecoder in pieces whose sizes come from the input
//     gives the same messages and error as feeding it at once; each message re-encodes to the
//     exact bytes it came from; errors are `.malformed`.
//  1  one datagram: what decodes re-encodes to the identical bytes; errors are `.malformed`.
//  2  reassembly over a hostile network: a real frame is cut into datagrams by RealtimeSender; the
//     input decides for each one whether it is lost, delivered, delivered twice or held back
//     (reordered), advances the clock, and slips in datagrams of its own (for other frames).
//     A frame the assembler completes is the sent one byte for byte; one whose datagrams all
//     arrived in time completes (unless enough foreign frames came to push it out); frames in
//     progress stay within the configured bound.
//  3  a stream hello, then frames whose picture numbers jump ahead of the stream's clock (issue 66
//     §3): the hello's rate and each frame's number, capture time and arrival time come from the
//     input; both go through the wire encoding and MessageDecoder, then PlayoutBuffer and
//     BoundedOutput into a sink that fills gaps as Y4M does. Pictures repeated never outnumber
//     the ones received nor exceed the bound's allowance at the end; every picture number the
//     playout passed is written, repeated or counted as left out.
import Foundation

struct Cursor {
    let bytes: [UInt8]
    var index = 0
    var isAtEnd: Bool { index >= bytes.count }
    mutating func byte() -> UInt8? {
        guard index < bytes.count else { return nil }
        defer { index += 1 }
        return bytes[index]
    }
    mutating func u16() -> UInt16? {
        guard let high = byte(), let low = byte() else { return nil }
        return UInt16(high) << 8 | UInt16(low)
    }
    mutating func take(_ count: Int) -> [UInt8] {
        let end = count >= bytes.count - index ? bytes.count : index + count
        defer { index = end }
        return Array(bytes[index..<end])
    }
}

func expectMalformed(_ error: any Error) {
    guard let error = error as? StreamError, error.code == .malformed else { fatalError("unexpected error \(error)") }
    precondition(!error.message.contains("\n"), "a multi-line error message")
}

func decodeAll(_ pieces: [Data]) -> (messages: [ControlMessage], error: StreamError?, pending: Int) {
    var decoder = MessageDecoder()
    var messages: [ControlMessage] = []
    for piece in pieces {
        decoder.append(piece)
        do {
            while let message = try decoder.next() { messages.append(message) }
        } catch {
            expectMalformed(error)
            return (messages, error as? StreamError, decoder.pendingBytes)
        }
    }
    return (messages, nil, decoder.pendingBytes)
}

func controlStream(_ cursor: inout Cursor) {
    let sizes = cursor.take(8).map { Int($0 % 64) + 1 }
    let stream = Data(cursor.take(.max))
    let whole = decodeAll([stream])
    var pieces: [Data] = []
    var offset = 0, turn = 0
    while offset < stream.count {
        let size = sizes.isEmpty ? 1 : sizes[turn % sizes.count]
        pieces.append(stream.subdata(in: offset..<min(stream.count, offset + size)))
        offset += size
        turn += 1
    }
    let split = decodeAll(pieces)
    precondition(whole.messages == split.messages && (whole.error == nil) == (split.error == nil), "the result depends on how the bytes were cut")
    let encoded = whole.messages.reduce(Data()) { $0 + $1.encoded() }
    precondition(stream.starts(with: encoded), "messages do not re-encode to the bytes they came from")
    if whole.error == nil {
        precondition(encoded.count + whole.pending == stream.count, "bytes went missing between messages")
    }
}

func oneDatagram(_ cursor: inout Cursor) {
    let bytes = Data(cursor.take(.max))
    do {
        let datagram = try RealtimeDatagram.decode(bytes)
        precondition(datagram.encoded() == bytes, "a datagram does not re-encode to its bytes")
    } catch {
        expectMalformed(error)
    }
}

func reassembly(_ cursor: inout Cursor) {
    let repair: RepairScheme = [.fec, .nack, .both, .none][Int(cursor.byte() ?? 0) % 4]
    let length = Int(cursor.u16() ?? 4000) * 4  // up to 256 KiB
    let datagramSize = RealtimeDatagram.shardHeaderSize + ShardHeader.minimumShardSize + Int(cursor.byte() ?? 255) * 4  // 299…1319 bytes
    let payload = Data((0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) })
    let start: UInt64 = 5_000_000_000
    let frame = Frame(index: 7, isKeyframe: true, captureTime: start, deadline: .milliseconds(300), payload: payload)
    var sender = RealtimeSender(repair: repair)
    var configuration = FrameAssembler.Configuration(repair: repair)
    configuration.maximumFramesInProgress = 64
    var assembler = FrameAssembler(configuration: configuration)
    var now = start
    var queue = sender.datagrams(for: frame, maximumDatagramSize: datagramSize, now: now)
    var held: [Data] = []
    var lost = false, completed = false, injected = 0

    func check(_ events: [FrameAssembler.Event]) {
        for case .completed(let done, _) in events where done.index == frame.index {
            precondition(done.payload == payload, "frame \(done.index) was reassembled with wrong bytes")
            precondition(!completed, "frame \(done.index) completed twice")
            completed = true
        }
        precondition(assembler.framesInProgress <= configuration.maximumFramesInProgress, "frames in progress past the bound")
    }
    func deliver(_ datagram: Data) {
        let (events, requests) = assembler.receive(datagram, now: now)
        check(events)
        answer(requests)
    }
    func answer(_ requests: [Data]) {
        for request in requests {
            guard case .nack(let index, let missing)? = try? RealtimeDatagram.decode(request) else {
                fatalError("the assembler asked with a datagram that is not a NACK")
            }
            queue += sender.handle(nackFor: index, missing: missing, now: now)
        }
    }

    var steps = 0
    while !queue.isEmpty, steps < 20_000 {
        steps += 1
        let datagram = queue.removeFirst()
        guard let action = cursor.byte() else {
            deliver(datagram)
            continue
        }
        switch action & 7 {
        case 0: lost = true
        case 1: deliver(datagram); deliver(datagram)
        case 2: held.append(datagram)
        case 3:
            deliver(datagram)
            for old in held { deliver(old) }
            held.removeAll()
        case 4:
            // A datagram of the input's own; one that claims to be part of our frame would be
            // a forgery the transport (QUIC, authenticated) already excludes.
            let own = Data(cursor.take(Int(cursor.byte() ?? 0) * 6))
            if case .shard(let header, _)? = try? RealtimeDatagram.decode(own), header.frameIndex == frame.index {
                deliver(datagram)
            } else {
                injected += 1
                deliver(own)
                deliver(datagram)
            }
        default: deliver(datagram)
        }
        if action & 0x80 != 0 {
            now += UInt64(action & 0x78) * 1_000_000  // up to 120 ms
            let (events, requests) = assembler.tick(now: now)
            check(events)
            answer(requests)
        }
    }
    for old in held { deliver(old) }
    if !queue.isEmpty { lost = true }  // the step cap: what is left arrives late
    let onTime = now <= frame.expiry
    for _ in 0..<40 {
        now += 10_000_000
        let (events, requests) = assembler.tick(now: now)
        check(events)
        answer(requests)
        while !queue.isEmpty { deliver(queue.removeFirst()) }
    }
    // Fewer foreign frames than the bound cannot push ours out.
    if !lost && onTime && injected < configuration.maximumFramesInProgress / 2 { precondition(completed, "every datagram arrived in time, yet the frame did not complete") }
}

/// Counts what the output asked for, filling gaps as Y4MWriter does.
struct FillingSink: FrameSink {
    var received: UInt64 = 0, filled: UInt64 = 0, leftOut: UInt64 = 0
    var fillsGaps: Bool { true }
    mutating func write(_ frame: Frame) throws { received += 1 }
    mutating func skip(_ index: UInt64) throws { filled += 1 }
    mutating func leaveOut(_ index: UInt64) throws { leftOut += 1 }
    mutating func close() throws {}
}

func gapsAfterHello(_ cursor: inout Cursor) {
    let numerator = UInt32(cursor.u16() ?? 30) << UInt32((cursor.byte() ?? 0) % 17)
    let denominator = UInt32(cursor.u16() ?? 1) | 1
    let hello = StreamHello(
        mode: .reliable, repair: .none, frameRate: FrameRate(numerator: max(numerator, 1), denominator: denominator),
        deadlineMilliseconds: UInt32(cursor.byte() ?? 100) * 4, container: .y4m, containerHeader: Data("YUV4MPEG2 W1 H1 Cmono\n".utf8))
    var decoder = MessageDecoder()
    decoder.append(ControlMessage.hello(hello).encoded())
    guard case .hello(let decoded)? = try? decoder.next(), decoded == hello else { fatalError("a hello does not survive the wire") }
    let start: UInt64 = 1 << 40
    var now = start, index: UInt64 = 0
    var playout = PlayoutBuffer()
    var output = BoundedOutput(bound: OutputBound(rate: decoded.frameRate))
    var sink = FillingSink()
    var steps = 0
    while !cursor.isAtEnd, steps < 256 {
        steps += 1
        guard let jump = cursor.u16(), let shift = cursor.byte(), let timing = cursor.byte() else { break }
        // Picture numbers that jump ahead (up to 2^63 and back to the end of the range).
        let (next, overflow) = index.addingReportingOverflow(UInt64(jump) << UInt64(shift % 48))
        index = overflow ? .max - UInt64(jump) : next
        now += UInt64(timing & 0x3F) * 10_000_000  // up to 630 ms between frames
        // Captured on time, long ago, or near the end of time.
        let capture: UInt64 = switch timing >> 6 {
        case 0: now
        case 1: now - min(now, 10_000_000_000)
        case 2: .max - UInt64(jump)
        default: 0
        }
        let frame = Frame(index: index, isKeyframe: true, captureTime: capture, deadline: .milliseconds(Int64(decoded.deadlineMilliseconds)), payload: Data([1]))
        decoder.append(ControlMessage.frame(frame).encoded())
        guard case .frame(let arrived)? = try? decoder.next(), arrived == frame else { fatalError("a frame does not survive the wire") }
        playout.add(arrived)
        do { try output.write(playout.release(now: now), elapsed: now - start, to: &sink) } catch { fatalError("the sink does not throw") }
    }
    let end = index == .max ? index : index + 1
    do { try output.write(playout.release(now: now, through: end), elapsed: now - start, to: &sink) } catch { fatalError("the sink does not throw") }
    output.finish(through: playout.nextIndex, sink: sink)
    precondition(sink.filled <= sink.received, "more pictures repeated (\(sink.filled)) than received (\(sink.received))")
    precondition(sink.filled <= output.bound.allowance(elapsed: now - start), "pictures repeated past the stream's clock")
    precondition(output.picturesWritten == sink.received + sink.filled, "the output's count is not the sink's")
    if playout.nextIndex < .max && output.picturesNotFilled < .max {
        precondition(
            output.picturesWritten + output.picturesNotFilled == playout.nextIndex,
            "picture numbers passed (\(playout.nextIndex)) are not all written, repeated or counted as left out")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzStreamWire(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    var cursor = Cursor(bytes: size == 0 || data == nil ? [] : Array(UnsafeBufferPointer(start: data!, count: size)))
    switch (cursor.byte() ?? 0) % 4 {
    case 0: controlStream(&cursor)
    case 1: oneDatagram(&cursor)
    case 2: reassembly(&cursor)
    default: gapsAfterHello(&cursor)
    }
    return 0
}
