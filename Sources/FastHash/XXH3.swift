internal import CXXHash

/// XXH3-128 over a stream of bytes, from Debian's libxxhash: feed bytes in any pieces, read the
/// digest at any point (of everything fed so far) without ending the stream.
///
/// The corresponding libxxhash functions are `XXH3_128bits_reset`, `XXH3_128bits_update` and
/// `XXH3_128bits_digest`.
public final class XXH3Stream {
    private let state: OpaquePointer

    /// A stream with nothing fed yet.
    public init() {
        guard let state = XXH3_createState() else { fatalError("XXH3_createState: out of memory") }
        self.state = state
        XXH3_128bits_reset(state)
    }

    deinit { XXH3_freeState(state) }

    /// Feeds bytes.
    public func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        _ = XXH3_128bits_update(state, base, bytes.count)
    }

    /// The 16-byte digest of everything fed so far, canonical (high 64 bits first, big-endian):
    /// its hex is what `xxhsum -H2` prints (`XXH128_canonicalFromHash`).
    public func digest() -> [UInt8] {
        var canonical = XXH128_canonical_t()
        XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state))
        return withUnsafeBytes(of: &canonical.digest) { Array($0) }
    }
}

/// One-shot XXH3 hashes.
public enum XXH3 {
    /// The 64-bit XXH3 of a buffer (`XXH3_64bits`).
    public static func hash64(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        XXH3_64bits(bytes.baseAddress, bytes.count)
    }
}
