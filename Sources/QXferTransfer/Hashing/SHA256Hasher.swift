internal import Crypto

// Apart from Digest.swift so that the fuzz targets, built without SwiftPM and so without
// swift-crypto, compile Digest.swift as it is and bring their own stand-in for this one type.

/// SHA-256 over swift-crypto; the digest is what `sha256sum` prints.
public final class SHA256Hasher: StreamingHasher {
    private var hash = SHA256()

    public init() {}

    public var algorithm: DigestAlgorithm { .sha256 }

    public func update(_ bytes: UnsafeRawBufferPointer) {
        hash.update(bufferPointer: bytes)
    }

    public func digest() -> [UInt8] {
        Array(hash.finalize())  // finalize works on a copy: the stream continues
    }
}
