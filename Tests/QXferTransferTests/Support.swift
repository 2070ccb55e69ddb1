import Foundation
import Subprocesses
@testable import QXferTransfer

/// A fresh temporary directory, removed by `cleanup()`.
struct TempDir {
    let path: String
    init() {
        var template = Array((NSTemporaryDirectory() + "/qxfer-transfer-XXXXXX").utf8CString)
        let result = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(result != nil, "mkdtemp failed")
        path = String(cString: result!)
    }
    func sub(_ name: String) -> String { path + "/" + name }
    func cleanup() { try? FileManager.default.removeItem(atPath: path) }
}

/// Deterministic generator for reproducible "random" tests.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

func pattern(_ count: Int, seed: Int = 0) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: ($0 + seed) % 251) }
}

func readFile(_ path: String) -> [UInt8]? {
    FileManager.default.contents(atPath: path).map { [UInt8]($0) }
}

func exists(_ path: String) -> Bool {
    var info = stat()
    return lstat(path, &info) == 0
}

/// Runs a command, returning its standard output, or nil if it cannot run or fails.
func run(_ executable: String, _ arguments: [String]) -> String? {
    guard let result = try? Subprocess.runBlocking(executable, arguments), result.status == 0, !result.timedOut else { return nil }
    return result.stdout
}

func which(_ name: String) -> String? {
    for dir in ["/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"] where FileManager.default.isExecutableFile(atPath: dir + "/" + name) {
        return dir + "/" + name
    }
    return nil
}
