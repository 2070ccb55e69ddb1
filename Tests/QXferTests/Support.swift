import Foundation
import NIOCore
@testable import QXfer

/// A temporary folder removed when the value goes away.
final class TemporaryDirectory: Sendable {
    let path: String
    init() {
        let template = FileManager.default.temporaryDirectory.appendingPathComponent("qxfer-test-XXXXXX").path
        var bytes = Array(template.utf8CString)
        path = bytes.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
    func file(_ name: String) -> String { path + "/" + name }
}

/// Identities shared by the tests (generating keys is cheap, but fingerprints are easier to
/// follow when they stay put).
enum Identities {
    static let server = try! HostIdentity.ephemeral(commonName: "test server")
    static let client = try! HostIdentity.ephemeral(commonName: "test client")
    static let stranger = try! HostIdentity.ephemeral(commonName: "test stranger")
}

/// Runs `listener` while `body` runs, then cancels it and waits for it to stop.
func withListener<Stack, Result: Sendable>(
    _ listener: NetworkListener<Stack>,
    handler: @escaping @Sendable (NetworkConnection<Stack>) async throws -> Void,
    _ body: @Sendable (UInt16) async throws -> Result
) async throws -> Result {
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await listener.run(handler) }
        let port = try await listener.port
        do {
            let result = try await body(port)
            group.cancelAll()
            try await group.waitForAll()
            return result
        } catch {
            group.cancelAll()
            throw error
        }
    }
}

/// The TCP sockets of this process whose local or remote port is `port`, from /proc.
///
/// Counting only this test's sockets keeps leak checks exact while other tests run in parallel.
func openSockets(port: UInt16) -> Int {
    var inodes = Set<String>()
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        guard let text = try? String(contentsOfFile: table, encoding: .utf8) else { continue }
        for line in text.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ")
            guard fields.count > 9 else { continue }
            let local = fields[1].split(separator: ":").last.flatMap { UInt16($0, radix: 16) }
            let remote = fields[2].split(separator: ":").last.flatMap { UInt16($0, radix: 16) }
            if local == port || remote == port { inodes.insert(String(fields[9])) }
        }
    }
    guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return -1 }
    var count = 0
    for entry in entries {
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + entry),
              target.hasPrefix("socket:[") else { continue }
        let inode = target.dropFirst("socket:[".count).dropLast()
        if inodes.contains(String(inode)) { count += 1 }
    }
    return count
}

/// Polls `condition` until it holds or `timeout` passes.
func eventually(timeout: Duration = .seconds(5), _ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return condition()
}

/// A byte stream that hands out scripted chunks: framers tested without sockets.
final class ScriptedStream: ByteStreamTransport, @unchecked Sendable {
    // Only the single reader of a test touches `chunks`; `written` is guarded by `lock`.
    private var chunks: [[UInt8]]
    private let lock = NSLock()
    private var writtenBytes: [UInt8] = []
    let peer = PeerIdentity(fingerprint: nil, trust: .unauthenticated, applicationProtocol: "qxfer/1")

    init(_ bytes: [UInt8], chunkSize: Int) {
        chunks = stride(from: 0, to: bytes.count, by: chunkSize).map { Array(bytes[$0..<min($0 + chunkSize, bytes.count)]) }
    }

    var written: [UInt8] { lock.withLock { writtenBytes } }

    func write(_ buffer: ByteBuffer) async throws {
        lock.withLock { writtenBytes += buffer.readableBytesView }
    }

    func read() async throws -> [ByteBuffer]? {
        guard !chunks.isEmpty else { return nil }
        return [ByteBuffer(bytes: chunks.removeFirst())]
    }

    func close() {}
    func metrics() async -> ConnectionMetrics { ConnectionMetrics() }
}
