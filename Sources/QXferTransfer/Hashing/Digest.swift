#if canImport(FastHash)  // fuzz/run.sh compiles FastHash's source into its one module
internal import FastHash
#endif
#if canImport(PlainText)  // fuzz/run.sh compiles TextFormat's source into its one module
internal import PlainText
#endif

/// A streaming hash: feed bytes in any pieces, read the digest at any point without ending
/// the stream (the digest of everything fed so far).
public protocol StreamingHasher: AnyObject {
    /// The algorithm, as named on the wire.
    var algorithm: DigestAlgorithm { get }
    /// Feeds bytes.
    func update(_ bytes: UnsafeRawBufferPointer)
    /// The digest of all bytes fed so far (canonical byte order). Feeding may continue.
    func digest() -> [UInt8]
}

extension StreamingHasher {
    /// Feeds `count` bytes of value 0 (a Zeros message, docs/PROTOCOL.md §3.8).
    func updateWithZeros(_ count: UInt64) {
        var left = count
        zeroBlock.withUnsafeBytes { zeros in
            while left > 0 {
                let n = Int(min(left, UInt64(zeros.count)))
                update(UnsafeRawBufferPointer(rebasing: zeros[..<n]))
                left -= UInt64(n)
            }
        }
    }
}

/// What ``StreamingHasher/updateWithZeros(_:)`` feeds, a piece at a time.
private let zeroBlock = [UInt8](repeating: 0, count: 1 << 20)

extension StreamingHasher {
    /// Feeds an array of bytes.
    public func update(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { update($0) }
    }
}

extension DigestAlgorithm {
    /// A fresh hasher for this algorithm.
    public func makeHasher() -> any StreamingHasher {
        switch self {
        case .xxh3_128: XXH3Hasher()
        case .sha256: SHA256Hasher()
        }
    }

    /// The digest of one buffer.
    public func digest(of bytes: [UInt8]) -> [UInt8] {
        let hasher = makeHasher()
        hasher.update(bytes)
        return hasher.digest()
    }
}

/// XXH3-128 (FastHash's ``XXH3Stream``, libxxhash). ``digest()`` returns the canonical
/// (big-endian) form: its hex is what `xxhsum -H2` prints.
public final class XXH3Hasher: StreamingHasher {
    private let stream = XXH3Stream()

    public init() {}

    public var algorithm: DigestAlgorithm { .xxh3_128 }

    public func update(_ bytes: UnsafeRawBufferPointer) { stream.update(bytes) }

    public func digest() -> [UInt8] { stream.digest() }

    /// The 64-bit XXH3 of a byte string, for short derived names.
    static func hash64(_ bytes: [UInt8]) -> UInt64 {
        bytes.withUnsafeBytes { XXH3.hash64($0) }
    }
}

/// Lower-case hexadecimal of bytes.
public func hexString(_ bytes: [UInt8]) -> String { TextFormat.hex(bytes) }
