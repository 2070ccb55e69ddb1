// Stand-ins for the three declarations Journal.swift uses from files the journal harness does
// not compile: Store/FileStore.swift and Hashing/Digest.swift import swift-crypto (a SwiftPM
// package that cannot be compiled here with a bare swiftc). Each is a copy of the original's
// data or its exact call into libxxhash, so the journal code under test is the project's own,
// unchanged. Keep in step with the originals.
internal import CXXHash

/// As Sources/QXferTransfer/Store/FileStore.swift (data only).
public struct FileTarget: Sendable, Hashable {
    public var path: SafePath
    public var size: UInt64?
    public var mode: UInt32
    public var modificationTime: Int64
    public var algorithm: DigestAlgorithm
}

/// As Sources/QXferTransfer/Hashing/Digest.swift: only the 64-bit hash the journal's check
/// line uses.
enum XXH3Hasher {
    static func hash64(_ bytes: [UInt8]) -> UInt64 {
        bytes.withUnsafeBytes { XXH3_64bits($0.baseAddress, $0.count) }
    }
}

/// As Sources/QXferTransfer/Hashing/Digest.swift.
public func hexString(_ bytes: [UInt8]) -> String { TextFormat.hex(bytes) }
