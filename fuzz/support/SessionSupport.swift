// Stand-in for the one declaration the session harness cannot compile from the project:
// Sources/QXferTransfer/Hashing/SHA256Hasher.swift imports swift-crypto, a SwiftPM package a
// bare swiftc cannot build here. The session logic under test only compares digests, so a
// 32-byte digest made of two XXH3-128 hashes (of the bytes, and of the bytes after one 0xFF)
// serves: distinct inputs give distinct digests as far as the fuzzer can tell. Everything else,
// XXH3-128 included, is the project's own Digest.swift.
internal import CXXHash

/// As Sources/QXferTransfer/Hashing/SHA256Hasher.swift, with another 32-byte function.
public final class SHA256Hasher: StreamingHasher {
    private let first = XXH3Hasher()
    private let second = XXH3Hasher()

    public init() {
        second.update([0xFF])
    }

    public var algorithm: DigestAlgorithm { .sha256 }

    public func update(_ bytes: UnsafeRawBufferPointer) {
        first.update(bytes)
        second.update(bytes)
    }

    public func digest() -> [UInt8] {
        first.digest() + second.digest()
    }
}
