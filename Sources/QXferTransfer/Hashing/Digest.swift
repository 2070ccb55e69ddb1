internal import CXXHash

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

/// XXH3-128 over Debian's libxxhash. ``digest()`` returns the canonical (big-endian) form:
/// its hex is what `xxhsum -H2` prints.
public final class XXH3Hasher: StreamingHasher {
    private let state: OpaquePointer

    public init() {
        guard let state = XXH3_createState() else { fatalError("XXH3_createState: out of memory") }
        self.state = state
        XXH3_128bits_reset(state)
    }

    deinit { XXH3_freeState(state) }

    public var algorithm: DigestAlgorithm { .xxh3_128 }

    public func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        _ = XXH3_128bits_update(state, base, bytes.count)
    }

    public func digest() -> [UInt8] {
        var canonical = XXH128_canonical_t()
        XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state))
        return withUnsafeBytes(of: &canonical.digest) { Array($0) }
    }

    /// The 64-bit XXH3 of a byte string, for short derived names.
    static func hash64(_ bytes: [UInt8]) -> UInt64 {
        bytes.withUnsafeBytes { XXH3_64bits($0.baseAddress, $0.count) }
    }
}

/// Lower-case hexadecimal of bytes.
public func hexString(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var out: [UInt8] = []
    out.reserveCapacity(bytes.count * 2)
    for b in bytes {
        out.append(digits[Int(b >> 4)])
        out.append(digits[Int(b & 0xf)])
    }
    return String(decoding: out, as: UTF8.self)
}
