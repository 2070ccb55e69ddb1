import FoundationEssentials
import Glibc

/// Appends big-endian integers and bytes to a buffer: the encoding half of the wire format.
struct ByteWriter {
    private(set) var data = Data()

    init(capacity: Int = 64) { data.reserveCapacity(capacity) }

    mutating func write<Integer: FixedWidthInteger>(_ value: Integer) {
        withUnsafeBytes(of: value.bigEndian) { data.append(contentsOf: $0) }
    }

    mutating func write(_ bytes: some DataProtocol) { data.append(contentsOf: bytes) }
}

/// Reads big-endian integers and byte runs from a buffer, refusing to read past its end.
///
/// Every read is bounds-checked: a short buffer is a ``StreamError`` (malformed), never a trap.
struct ByteReader {
    private let data: Data
    private(set) var offset: Int

    init(_ data: Data) {
        self.data = data
        self.offset = data.startIndex
    }

    var remaining: Int { data.endIndex - offset }

    mutating func read<Integer: FixedWidthInteger>(_ type: Integer.Type, _ what: @autoclosure () -> String) throws -> Integer {
        let size = MemoryLayout<Integer>.size
        guard remaining >= size else { throw StreamError(.malformed, "\(what()): \(remaining) bytes left, \(size) needed") }
        var value: Integer = 0
        for byte in data[offset..<offset + size] { value = value << 8 | Integer(byte) }
        offset += size
        return value
    }

    mutating func read(count: Int, _ what: @autoclosure () -> String) throws -> Data {
        guard count >= 0, remaining >= count else {
            throw StreamError(.malformed, "\(what()): \(count) bytes announced, \(remaining) present")
        }
        defer { offset += count }
        return data[offset..<offset + count]
    }

    mutating func readRest() -> Data {
        defer { offset = data.endIndex }
        return data[offset...]
    }
}

/// An error from the streaming module: a code to match on and one line for people.
public struct StreamError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What went wrong, as a value to match on.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short machine-readable name.
        public let name: String
        public var description: String { name }

        /// An input file (IVF or Y4M) is not what it claims to be, or ends early.
        public static let badInput = Code(name: "bad-input")
        /// A message or datagram from the peer breaks the stream protocol.
        public static let malformed = Code(name: "malformed")
        /// An option or a combination of options cannot work.
        public static let invalidConfiguration = Code(name: "invalid-configuration")
        /// The output cannot be written.
        public static let output = Code(name: "output")
        /// The peer did not answer in time.
        public static let timeout = Code(name: "timeout")
        /// The receiver refused the stream before it started (it serves another one).
        public static let refused = Code(name: "refused")
    }

    /// What went wrong.
    public let code: Code
    /// One line for a person.
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
    public static func == (lhs: StreamError, rhs: StreamError) -> Bool { lhs.code == rhs.code }
    public func hash(into hasher: inout Hasher) { hasher.combine(code) }
}
