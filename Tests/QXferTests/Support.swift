import Foundation
import NIOCore
import QXfer
@_exported import Subprocesses
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

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

/// An echo handler: returns every byte until the client finishes its direction.
@Sendable func echoUntilFinished<Stack: ByteStreamProtocol>(_ connection: NetworkConnection<Stack>) async throws {
    while true {
        let chunk: Data
        do {
            chunk = try await connection.receive(atLeast: 1, atMost: 1 << 20).content
        } catch let error as QXferError where error.code == .endOfStream {
            return
        }
        try await connection.send(chunk)
    }
}

/// Runs CPU-bound work on a thread of its own. Swift Testing runs tests on the cooperative
/// pool, two threads on two cores: a test computing for seconds there holds one of them, and
/// two at once stall every other test's tasks — a socket test's peer then misses its own
/// deadlines (the trickling-message test saw its sender stalled past the 4 s idle timeout).
func offThePool<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread { continuation.resume(returning: work()) }.start()
    }
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

    func finish() async throws {}
    func reset(errorCode: UInt64) {}
    func close() {}
    func metrics() async -> ConnectionMetrics { ConnectionMetrics() }
    var multiplexer: (any StreamMultiplexer)? { nil }
}

/// A transport that hands out what the test feeds it, one read per feed, waiting until then;
/// counts the reads asked for (a read asked for means the reader has kept everything before it).
final class FedStream: ByteStreamTransport, @unchecked Sendable {
    private let feeds = AsyncStream<ByteBuffer>.makeStream()
    private var iterator: AsyncStream<ByteBuffer>.Iterator  // only the one reader touches it
    private let asked = Locked(0)
    let peer = PeerIdentity(fingerprint: nil, trust: .unauthenticated, applicationProtocol: "qxfer/1")

    init() { iterator = feeds.stream.makeAsyncIterator() }
    func feed(_ buffer: ByteBuffer) { feeds.continuation.yield(buffer) }
    func feed(_ bytes: [UInt8]) { feed(ByteBuffer(bytes: bytes)) }
    var readsAsked: Int { asked.withLock { $0 } }

    func read() async throws -> [ByteBuffer]? {
        asked.withLock { $0 += 1 }
        return await iterator.next().map { [$0] }
    }
    func write(_ buffer: ByteBuffer) async throws {}
    func finish() async throws {}
    func reset(errorCode: UInt64) {}
    func close() { feeds.continuation.finish() }
    func metrics() async -> ConnectionMetrics { ConnectionMetrics() }
    var multiplexer: (any StreamMultiplexer)? { nil }
}

// MARK: - Helpers for the loopback and interop tests

/// Values a listener's handlers record for the test body to inspect (thread-safe).
final class Recorder<Value: Sendable>: @unchecked Sendable {
    // `values` is only touched under `lock`.
    private let lock = NSLock()
    private var values: [Value] = []
    func append(_ value: Value) { lock.withLock { values.append(value) } }
    var all: [Value] { lock.withLock { values } }
    var count: Int { lock.withLock { values.count } }
}

/// A test failure raised when an operation did not finish in time (a hang, not a slowness check).
struct HangError: Error, CustomStringConvertible {
    let what: String
    var description: String { "\(what) did not finish in time (hang)" }
}

/// Runs `operation` in its own task and gives up (cancelling it) after `limit`, so a hang fails
/// the test instead of stalling the suite. Never waits for an operation that ignores cancellation.
func within<T: Sendable>(
    _ limit: Duration, _ what: String = "the operation", _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    let task = Task { try await operation() }
    let outcome = Recorder<Result<T, any Error>>()
    let finished = AsyncStream<Void>.makeStream()
    Task {
        let result = await task.result
        outcome.append(result)
        finished.continuation.finish()
    }
    let timer = Task {
        try? await Task.sleep(for: limit)
        finished.continuation.finish()
    }
    for await _ in finished.stream {}
    timer.cancel()
    if let result = outcome.all.first { return try result.get() }
    task.cancel()
    throw HangError(what: what)
}

/// Collects every state a connection goes through, from before it starts until a final state.
func collectStates<Stack>(_ connection: NetworkConnection<Stack>) -> Task<[ConnectionState], Never> {
    let states = connection.states  // subscribed now, so nothing is missed
    return Task {
        var seen: [ConnectionState] = []
        for await state in states { seen.append(state) }
        return seen
    }
}

extension ConnectionState {
    /// The error of a `waiting` or `failed` state.
    var error: QXferError? {
        switch self {
        case .waiting(let error), .failed(let error): error
        default: nil
        }
    }
    var isPreparing: Bool { if case .preparing = self { true } else { false } }
    var isReady: Bool { if case .ready = self { true } else { false } }
    var isWaiting: Bool { if case .waiting = self { true } else { false } }
    var isFailed: Bool { if case .failed = self { true } else { false } }
    var isCancelled: Bool { if case .cancelled = self { true } else { false } }
}

/// Starts `connection` and returns the error of its first failed attempt (the one its
/// `waiting` state carries), then cancels it; nil if it reached a final state without one.
func firstAttemptError<Stack>(of connection: NetworkConnection<Stack>) async -> QXferError? {
    let watcher = Task { () -> QXferError? in
        for await state in connection.states {
            if case .waiting(let error) = state { return error }
            if state.isFinal { return nil }
        }
        return nil
    }
    let start = Task { try await connection.start() }
    let error = await watcher.value
    connection.cancel()
    start.cancel()
    _ = await start.result
    return error
}

/// The error `body` throws, as a QXferError (nil if it did not throw; a non-QXferError is
/// reported as code "foreign").
func qxferError(_ body: () async throws -> Void) async -> QXferError? {
    do {
        try await body()
        return nil
    } catch let error as QXferError {
        return error
    } catch {
        return QXferError(.init("foreign"), "\(type(of: error)): \(error)")
    }
}

/// A TCP port on 127.0.0.1 that refuses connections: bound but not listening, held until closed.
final class ClosedPort: Sendable {
    let fd: Int32
    let port: UInt16
    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Bool in
                bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard fd >= 0, bound else {
            if fd >= 0 { close(fd) }
            throw HangError(what: "binding a closed port")
        }
        self.fd = fd
        port = UInt16(bigEndian: address.sin_port)
    }
    deinit { close(fd) }
}

/// The TCP sockets of this process whose local or remote port is `port`, from /proc: exact
/// leak checks even while other tests run in parallel.
///
/// Reads /proc/net/tcp{,6} to the end: `String(contentsOfFile:)` trusts the size procfs
/// reports (0) and returns only the first page (about 27 sockets).
func socketCount(port: UInt16) -> Int {
    var inodes = Set<Substring>()
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        guard let handle = FileHandle(forReadingAtPath: table),
              let data = try? handle.readToEnd() else { continue }
        try? handle.close()
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ")
            guard fields.count > 9 else { continue }
            let local = fields[1].split(separator: ":").last.flatMap { UInt16($0, radix: 16) }
            let remote = fields[2].split(separator: ":").last.flatMap { UInt16($0, radix: 16) }
            if (local == port || remote == port) && fields[9] != "0" { inodes.insert(fields[9]) }
        }
    }
    guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return -1 }
    var count = 0
    for entry in entries {
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + entry),
              target.hasPrefix("socket:[") else { continue }
        if inodes.contains(target.dropFirst("socket:[".count).dropLast()) { count += 1 }
    }
    return count
}
