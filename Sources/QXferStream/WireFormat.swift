import FoundationEssentials
import Glibc
#if canImport(PlainText)  // fuzz/run.sh compiles TextFormat's source into its one module
import PlainText
#endif

/// How frames travel from the sender to the receiver.
public enum StreamMode: String, Sendable, Hashable, CaseIterable, Codable {
    /// Every frame on one ordered stream: nothing is lost, a lost packet delays every later frame.
    case reliable
    /// One QUIC stream per frame, reset when the frame is past its deadline: a loss delays only
    /// its own frame. On TCP+TLS frames share the one stream (as `reliable`).
    case streamPerFrame = "stream-per-frame"
    /// QUIC datagrams: late frames are dropped, losses are repaired within the deadline by FEC
    /// or by retransmission on request (NACK). On TCP+TLS frames share the one stream and the
    /// sender drops those already past their deadline.
    case realtime
}

/// How realtime mode repairs lost datagrams.
public enum RepairScheme: String, Sendable, Hashable, CaseIterable, Codable {
    /// Reed–Solomon parity datagrams sent with each frame: repair costs no round trip.
    case fec
    /// The receiver asks for missing datagrams; the sender resends them while the frame is
    /// still within its deadline: repair costs a round trip, no bandwidth unless something is lost.
    case nack
    /// Parity first, then requests for what parity could not rebuild.
    case both
    /// No repair: a frame with a lost datagram is lost.
    case none

    /// The scheme `realtime` uses unless told otherwise: parity, then requests for what parity
    /// could not rebuild. Chosen by measurement at 50 ms RTT and 1 % loss (docs/STREAMING.md):
    /// as fast as FEC at p95, the fewest late frames and the lowest p99 of the three.
    public static let `default`: RepairScheme = .both

    var sendsParity: Bool { self == .fec || self == .both }
    var sendsNacks: Bool { self == .nack || self == .both }
}

/// The container the frames came in, so the receiver can write the same one.
public enum ContainerKind: UInt8, Sendable, Hashable, Codable {
    /// Frames from the synthetic source (not decodable video).
    case synthetic = 0
    /// IVF: VP8, VP9 or AV1 frames.
    case ivf = 1
    /// YUV4MPEG2: raw pictures.
    case y4m = 2
}

/// A message on the connection's own byte stream (and, for `stream-per-frame`, on each frame's
/// stream). On the wire: type (UInt8), body length (UInt32, big-endian), body. docs/STREAMING.md
/// lists every message.
public enum ControlMessage: Sendable, Hashable {
    /// Sender → receiver, first: what is coming.
    case hello(StreamHello)
    /// Receiver → sender: clocks compared, start sending.
    case ready
    /// Receiver → sender: a clock probe sent at `t1` (receiver's clock, ns).
    case ping(id: UInt32, t1: UInt64)
    /// Sender → receiver: the answer to a probe, received at `t2` and sent at `t3` (sender's clock).
    case pong(id: UInt32, t1: UInt64, t2: UInt64, t3: UInt64)
    /// One frame, whole.
    case frame(Frame)
    /// Sender → receiver: no more frames; `framesSent` were offered.
    case end(framesSent: UInt64)
    /// Receiver → sender: the final totals, as the JSON line the receiver printed.
    case report(Data)
    /// Receiver → sender: its output failed (`reason`, one line); it takes no more frames.
    case stop(reason: String)

    /// The longest `stop` reason, in bytes of UTF-8.
    public static let maximumReasonSize = 1024

    /// The largest message body accepted; a larger length fails the stream before allocating.
    public static let maximumBodySize = 64 << 20

    var type: UInt8 {
        switch self {
        case .hello: 1
        case .ready: 2
        case .ping: 3
        case .pong: 4
        case .frame: 5
        case .end: 6
        case .report: 7
        case .stop: 8
        }
    }

    /// The message as bytes.
    public func encoded() -> Data {
        var body = ByteWriter()
        switch self {
        case .hello(let hello):
            body.write(UInt8(1))  // protocol version
            body.write(hello.mode.wireValue)
            body.write(hello.repair.wireValue)
            body.write(hello.frameRate.numerator)
            body.write(hello.frameRate.denominator)
            body.write(hello.deadlineMilliseconds)
            body.write(hello.container.rawValue)
            body.write(UInt32(hello.containerHeader.count))
            body.write(hello.containerHeader)
        case .ready: break
        case .ping(let id, let t1):
            body.write(id)
            body.write(t1)
        case .pong(let id, let t1, let t2, let t3):
            body.write(id)
            body.write(t1)
            body.write(t2)
            body.write(t3)
        case .frame(let frame):
            body.write(frame.index)
            body.write(frame.captureTime)
            body.write(frame.timestamp)
            body.write(frame.deadlineMilliseconds)
            body.write(UInt8(frame.isKeyframe ? 1 : 0))
            body.write(frame.payload)
        case .end(let framesSent):
            body.write(framesSent)
        case .report(let json):
            body.write(json)
        case .stop(let reason):
            // Cut at a character boundary: the decoder refuses a longer one.
            var text = reason
            while text.utf8.count > Self.maximumReasonSize { text.removeLast() }
            body.write(Data(text.utf8))
        }
        var message = ByteWriter(capacity: 5 + body.data.count)
        message.write(type)
        message.write(UInt32(body.data.count))
        message.write(body.data)
        return message.data
    }

    /// Decodes one message body of the given type.
    static func decode(type: UInt8, body: Data) throws -> ControlMessage {
        var reader = ByteReader(body)
        let message: ControlMessage
        switch type {
        case 1:
            let version = try reader.read(UInt8.self, "hello version")
            guard version == 1 else { throw StreamError(.malformed, "the sender speaks stream protocol version \(version); this receiver speaks 1") }
            guard let mode = StreamMode(wireValue: try reader.read(UInt8.self, "hello mode")),
                  let repair = RepairScheme(wireValue: try reader.read(UInt8.self, "hello repair")) else {
                throw StreamError(.malformed, "the sender asked for an unknown mode or repair scheme")
            }
            let numerator = try reader.read(UInt32.self, "hello rate")
            let denominator = try reader.read(UInt32.self, "hello rate")
            let deadline = try reader.read(UInt32.self, "hello deadline")
            guard let container = ContainerKind(rawValue: try reader.read(UInt8.self, "hello container")) else {
                throw StreamError(.malformed, "the sender announced an unknown container")
            }
            let headerLength = try reader.read(UInt32.self, "hello header length")
            guard headerLength <= 4096 else { throw StreamError(.malformed, "a \(headerLength)-byte container header is too long") }
            let header = try reader.read(count: Int(headerLength), "hello header")
            guard numerator > 0, denominator > 0 else { throw StreamError(.malformed, "the sender announced a zero frame rate") }
            message = .hello(StreamHello(
                mode: mode, repair: repair, frameRate: FrameRate(numerator: numerator, denominator: denominator),
                deadlineMilliseconds: deadline, container: container, containerHeader: Data(header)))
        case 2: message = .ready
        case 3: message = .ping(id: try reader.read(UInt32.self, "ping"), t1: try reader.read(UInt64.self, "ping"))
        case 4:
            message = .pong(
                id: try reader.read(UInt32.self, "pong"), t1: try reader.read(UInt64.self, "pong"),
                t2: try reader.read(UInt64.self, "pong"), t3: try reader.read(UInt64.self, "pong"))
        case 5:
            let index = try reader.read(UInt64.self, "frame index")
            let capture = try reader.read(UInt64.self, "frame capture time")
            let timestamp = try reader.read(UInt64.self, "frame timestamp")
            let deadline = try reader.read(UInt32.self, "frame deadline")
            let flags = try reader.read(UInt8.self, "frame flags")
            guard flags & ~1 == 0 else { throw StreamError(.malformed, "frame flags \(flags) set unknown bits") }
            message = .frame(Frame(
                index: index, isKeyframe: flags & 1 != 0, captureTime: capture,
                deadline: .milliseconds(Int64(deadline)), payload: Data(reader.readRest()), timestamp: timestamp))
            return message
        case 6: message = .end(framesSent: try reader.read(UInt64.self, "end"))
        case 7: return .report(Data(reader.readRest()))
        case 8:
            let reason = reader.readRest()
            guard reason.count <= maximumReasonSize else { throw StreamError(.malformed, "a \(reason.count)-byte stop reason is too long") }
            guard let text = String(validating: reason, as: UTF8.self) else { throw StreamError(.malformed, "a stop reason that is not UTF-8") }
            return .stop(reason: text)
        default: throw StreamError(.malformed, "unknown stream message type \(type)")
        }
        guard reader.remaining == 0 else { throw StreamError(.malformed, "\(reader.remaining) stray bytes after a type-\(type) message") }
        return message
    }
}

/// What the sender announces before its first frame.
public struct StreamHello: Sendable, Hashable {
    /// How frames travel.
    public var mode: StreamMode
    /// How realtime mode repairs losses.
    public var repair: RepairScheme
    /// Frames per second, as the source declares it.
    public var frameRate: FrameRate
    /// How long after capture a frame is still useful.
    public var deadlineMilliseconds: UInt32
    /// The source's container.
    public var container: ContainerKind
    /// The source's container header (IVF file header, Y4M header line), so the receiver
    /// writes a file of the same kind.
    public var containerHeader: Data

    public init(mode: StreamMode, repair: RepairScheme, frameRate: FrameRate, deadlineMilliseconds: UInt32, container: ContainerKind, containerHeader: Data) {
        self.mode = mode
        self.repair = repair
        self.frameRate = frameRate
        self.deadlineMilliseconds = deadlineMilliseconds
        self.container = container
        self.containerHeader = containerHeader
    }
}

/// A frame rate as a fraction, as containers store it (30000/1001 for NTSC).
public struct FrameRate: Sendable, Hashable, CustomStringConvertible {
    /// Frames per `denominator` seconds.
    public var numerator: UInt32
    public var denominator: UInt32

    public init(numerator: UInt32, denominator: UInt32 = 1) {
        precondition(numerator > 0 && denominator > 0, "a frame rate needs a positive fraction")
        self.numerator = numerator
        self.denominator = denominator
    }

    /// Frames per second.
    public var perSecond: Double { Double(numerator) / Double(denominator) }
    /// The time between two frames, in nanoseconds (rounded down).
    public var interval: UInt64 { UInt64(1_000_000_000) * UInt64(denominator) / UInt64(numerator) }
    /// When frame `index` is due, in nanoseconds from the first, without accumulating rounding.
    public func dueTime(ofFrame index: UInt64) -> UInt64 {
        index &* 1_000_000_000 &* UInt64(denominator) / UInt64(numerator)
    }
    public var description: String { denominator == 1 ? "\(numerator)" : TextFormat.fixed(perSecond, places: 3) }
}

/// Cuts a byte stream into ``ControlMessage``s, whatever the chunk boundaries: feed bytes,
/// take messages. A length above the limit is refused before anything is buffered.
public struct MessageDecoder: Sendable {
    private var buffer = Data()
    private let limit: Int

    public init(limit: Int = ControlMessage.maximumBodySize) { self.limit = limit }

    /// Adds received bytes.
    public mutating func append(_ bytes: Data) { buffer.append(bytes) }

    /// Bytes received that are not yet a whole message.
    public var pendingBytes: Int { buffer.count }

    /// The next whole message, or nil if more bytes are needed.
    public mutating func next() throws -> ControlMessage? {
        guard buffer.count >= 5 else { return nil }
        let start = buffer.startIndex
        let type = buffer[start]
        let length = buffer[start + 1..<start + 5].reduce(0) { $0 << 8 | Int($1) }
        guard length <= limit else { throw StreamError(.malformed, "the peer announced a \(length)-byte message; the limit is \(limit)") }
        guard buffer.count >= 5 + length else { return nil }
        let body = buffer[start + 5..<start + 5 + length]
        let message = try ControlMessage.decode(type: type, body: Data(body))
        buffer.removeSubrange(start..<start + 5 + length)
        if buffer.isEmpty { buffer = Data() }  // drop the old allocation after a large frame
        return message
    }
}

extension StreamMode {
    var wireValue: UInt8 {
        switch self {
        case .reliable: 0
        case .streamPerFrame: 1
        case .realtime: 2
        }
    }
    init?(wireValue: UInt8) {
        switch wireValue {
        case 0: self = .reliable
        case 1: self = .streamPerFrame
        case 2: self = .realtime
        default: return nil
        }
    }
}

extension RepairScheme {
    var wireValue: UInt8 {
        switch self {
        case .none: 0
        case .fec: 1
        case .nack: 2
        case .both: 3
        }
    }
    init?(wireValue: UInt8) {
        switch wireValue {
        case 0: self = .none
        case 1: self = .fec
        case 2: self = .nack
        case 3: self = .both
        default: return nil
        }
    }
}

extension Frame {
    /// The deadline in whole milliseconds, as the wire carries it.
    var deadlineMilliseconds: UInt32 {
        let (seconds, attoseconds) = deadline.components
        return UInt32(clamping: max(0, seconds) * 1000 + max(0, attoseconds) / 1_000_000_000_000_000)
    }
}
