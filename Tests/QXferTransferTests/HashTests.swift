import Foundation
import Testing
@testable import QXferTransfer

@Suite struct HashTests {
    @Test func xxh3KnownVectors() {
        // From `xxhsum -H2` 0.8.1.
        #expect(hexString(DigestAlgorithm.xxh3_128.digest(of: [])) == "99aa06d3014798d86001c324468d497f")
        #expect(hexString(DigestAlgorithm.xxh3_128.digest(of: Array("abc".utf8))) == "06b05ab6733a618578af5f94892f3950")
        #expect(hexString(DigestAlgorithm.xxh3_128.digest(of: pattern(1 << 20))) == "53738d98098cabba6e0d7ac36b8c10ff")
    }

    @Test func sha256KnownVectors() {
        #expect(hexString(DigestAlgorithm.sha256.digest(of: [])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(hexString(DigestAlgorithm.sha256.digest(of: Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(hexString(DigestAlgorithm.sha256.digest(of: pattern(1 << 20))) == "631b84027d6b9e52b539c4e8373622d23032dfadc64d60af87339c9037e4f769")
    }

    /// Streaming in random pieces equals one shot, and reading the digest midway does not
    /// disturb the stream.
    @Test(arguments: DigestAlgorithm.allCases) func streamingMatchesOneShot(_ algorithm: DigestAlgorithm) {
        let data = pattern(300_001, seed: 3)
        var rng = SplitMix64(seed: 11)
        let hasher = algorithm.makeHasher()
        var i = 0
        while i < data.count {
            let n = min(data.count - i, Int.random(in: 0...70_000, using: &rng))
            hasher.update(Array(data[i..<i + n]))
            if i < 1000 { #expect(hasher.digest() == algorithm.digest(of: Array(data[..<(i + n)]))) }
            i += n
        }
        #expect(hasher.digest() == algorithm.digest(of: data))
        #expect(hasher.digest().count == algorithm.digestLength)
        #expect(hasher.algorithm == algorithm)
    }

    @Test(.enabled(if: which("xxhsum") != nil, "xxhsum (Debian package xxhash) not installed"))
    func matchesXxhsum() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let data = pattern(3 << 20, seed: 17) + Array("tail".utf8)
        try Data(data).write(to: URL(fileURLWithPath: temp.sub("f")))
        let output = try #require(run(which("xxhsum")!, ["-H2", temp.sub("f")]))
        #expect(output.split(separator: " ").first.map(String.init) == hexString(DigestAlgorithm.xxh3_128.digest(of: data)))
    }

    @Test(.enabled(if: which("sha256sum") != nil)) func matchesSha256sum() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let data = pattern(3 << 20, seed: 5)
        try Data(data).write(to: URL(fileURLWithPath: temp.sub("f")))
        let output = try #require(run(which("sha256sum")!, [temp.sub("f")]))
        #expect(output.split(separator: " ").first.map(String.init) == hexString(DigestAlgorithm.sha256.digest(of: data)))
    }
}
