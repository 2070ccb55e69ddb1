import Foundation
import QXfer
import LinuxSystem
@testable import QXferTransfer
import Testing

/// Both stacks, so every session test runs over QUIC (a stream per file) and TCP+TLS (one stream).
enum StackKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case quic, tls
    var testDescription: String { rawValue }
}

/// Two identities for every session test: the receiver's (server) and the sender's (client).
let serverIdentity = try! HostIdentity.ephemeral(commonName: "receiver")
let clientIdentity = try! HostIdentity.ephemeral(commonName: "sender")

/// Runs `receive` on the server side of one connection and `send` on a client connected to it,
/// over the chosen stack; returns both results.
/// `clientMessageLimit` lets a hostile client send frames longer than the protocol allows.
func withConnectedPair<ServerResult: Sendable, ClientResult: Sendable>(
    _ kind: StackKind, clientMessageLimit: Int = ProtocolLimits.maximumMessageSize,
    receive: @escaping @Sendable (any TransferPeer) async throws -> ServerResult,
    send: @escaping @Sendable (any TransferPeer) async throws -> ClientResult
) async throws -> (server: Result<ServerResult, any Error>, client: Result<ClientResult, any Error>) {
    switch kind {
    case .quic: try await connectedPair(QUIC(), clientMessageLimit: clientMessageLimit, receive: receive, send: send)
    case .tls: try await connectedPair(TLS(), clientMessageLimit: clientMessageLimit, receive: receive, send: send)
    }
}

/// A connection of either stack, so tests are written once.
protocol TransferPeer: Sendable {
    func runReceiver(_ receiver: TransferReceiver) async throws -> TransferSummary
    func runSender(_ sender: TransferSender) async throws -> TransferSummary
    func send(_ message: Message) async throws
    /// Sends a frame of any type and body, bypassing the codec.
    func sendFrame(type: UInt32, body: [UInt8]) async throws
    func receiveMessage() async throws -> Message?
    func openDataStream() async throws -> any TransferPeer
    /// The next data stream the peer opened (QUIC), or this connection (TLS).
    func acceptDataStream() async throws -> any TransferPeer
    func finish() async throws
    /// Abandons a data stream (QUIC's RESET_STREAM); nothing on TCP+TLS.
    func reset()
    var hasIndependentStreams: Bool { get }
}

struct Peer<Stack: TLVStack>: TransferPeer {
    let connection: NetworkConnection<Stack>
    func runReceiver(_ receiver: TransferReceiver) async throws -> TransferSummary { try await receiver.run(over: connection) }
    func runSender(_ sender: TransferSender) async throws -> TransferSummary { try await sender.run(over: connection) }
    func send(_ message: Message) async throws { try await connection.send(message) }
    func sendFrame(type: UInt32, body: [UInt8]) async throws { try await connection.send(body, type: type) }
    func receiveMessage() async throws -> Message? { try await connection.receiveMessage() }
    func openDataStream() async throws -> any TransferPeer {
        hasIndependentStreams ? Peer(connection: try await connection.openStream()) : self
    }
    func acceptDataStream() async throws -> any TransferPeer {
        guard hasIndependentStreams else { return self }
        for try await stream in connection.incomingStreams { return Peer(connection: stream) }
        throw TransferError(.cancelled, "the connection ended without a data stream")
    }
    func finish() async throws { try await connection.finish() }
    func reset() { if hasIndependentStreams { connection.reset() } }
    var hasIndependentStreams: Bool { connection.parameters.stack.transport.hasIndependentStreams }
}

private func connectedPair<Transport: SecureTransport, ServerResult: Sendable, ClientResult: Sendable>(
    _ transport: Transport, clientMessageLimit: Int,
    receive: @escaping @Sendable (any TransferPeer) async throws -> ServerResult,
    send: @escaping @Sendable (any TransferPeer) async throws -> ClientResult
) async throws -> (server: Result<ServerResult, any Error>, client: Result<ClientResult, any Error>) {
    let listener = NetworkListener(on: 0, host: "127.0.0.1") { TLV { transport.identity(serverIdentity) } }
    let (results, continuation) = AsyncStream.makeStream(of: Result<ServerResult, any Error>.self)
    return try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask {
            try await listener.run { connection in
                let result: Result<ServerResult, any Error>
                do { result = .success(try await receive(Peer(connection: connection))) } catch { result = .failure(error) }
                continuation.yield(result)
            }
        }
        let port = try await listener.port
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
            TLV(maximumMessageSize: clientMessageLimit) { transport.identity(clientIdentity).peerFingerprint(serverIdentity.fingerprint) }
        }
        let client: Result<ClientResult, any Error>
        do { client = .success(try await send(Peer(connection: connection))) } catch { client = .failure(error) }
        var server: Result<ServerResult, any Error>?
        for await result in results {
            server = result
            break
        }
        connection.cancel()
        group.cancelAll()
        return (try #require(server), client)
    }
}

// MARK: - Trees

/// What a file-system entry looks like, for comparing two trees.
struct EntryShape: Equatable, CustomStringConvertible {
    var kind: String
    var mode: mode_t
    var mtime: Int64
    var digest: String
    var description: String { "\(kind) \(String(mode, radix: 8)) \(mtime) \(digest)" }
}

/// Every entry under `root` by relative path (lstat, so links are compared as links). Directory
/// mtimes are compared too: the receiver applies them after writing inside.
func shape(of root: String) -> [String: EntryShape] {
    var result: [String: EntryShape] = [:]
    func walk(_ relative: String) {
        let path = relative.isEmpty ? root : root + "/" + relative
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        let mtime = Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec)
        switch info.st_mode & S_IFMT {
        case S_IFDIR:
            if !relative.isEmpty { result[relative] = EntryShape(kind: "dir", mode: info.st_mode & 0o777, mtime: mtime, digest: "") }
            for name in (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [] {
                walk(relative.isEmpty ? name : relative + "/" + name)
            }
        case S_IFLNK:
            let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: path)) ?? "?"
            result[relative] = EntryShape(kind: "link", mode: 0, mtime: mtime, digest: target)
        default:
            let bytes = readFile(path) ?? []
            result[relative] = EntryShape(kind: "file", mode: info.st_mode & 0o777, mtime: mtime, digest: hexString(DigestAlgorithm.xxh3_128.digest(of: bytes)))
        }
    }
    walk("")
    return result
}

/// A tree with the names and shapes that break naive tools.
func makeOddTree(in root: String) throws {
    let fm = FileManager.default
    let top = root + "/odd tree"
    try fm.createDirectory(atPath: top + "/empty folder", withIntermediateDirectories: true)
    try Data(pattern(3 << 20, seed: 7)).write(to: URL(fileURLWithPath: top + "/three MiB.bin"))
    _ = fm.createFile(atPath: top + "/empty file", contents: Data())
    _ = fm.createFile(atPath: top + "/ünïcödé ✓ 日本語.txt", contents: Data("unicode\n".utf8))
    _ = fm.createFile(atPath: top + "/ends with space ", contents: Data("space\n".utf8))
    _ = fm.createFile(atPath: top + "/...", contents: Data("dots\n".utf8))
    _ = fm.createFile(atPath: top + "/back\\slash", contents: Data("backslash\n".utf8))
    var deep = top + "/deep"
    for level in 0..<20 { deep += "/level \(level)" }
    try fm.createDirectory(atPath: deep, withIntermediateDirectories: true)
    _ = fm.createFile(atPath: deep + "/bottom.txt", contents: Data("bottom\n".utf8))
    try fm.createSymbolicLink(atPath: top + "/deep/link to bottom", withDestinationPath: "level 0/level 1/level 2")
    try fm.createSymbolicLink(atPath: top + "/escapes", withDestinationPath: "../../outside")
    chmod(top + "/three MiB.bin", 0o640)
    chmod(top + "/empty folder", 0o750)
    var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 123_456_789), timespec(tv_sec: 1_000_000_000, tv_nsec: 123_456_789)]
    utimensat(AT_FDCWD, top + "/empty file", &times, 0)
}

@Suite("qxfer/1 sessions over loopback")
struct SessionTests {
    @Test("A tree with odd names, empty files and folders, deep nesting, modes, times and links arrives identical", arguments: StackKind.allCases)
    func treeArrivesIdentical(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("src"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        try makeOddTree(in: scratch.sub("src"))
        let tree = try SourceTree.scan([scratch.sub("src/odd tree")])
        #expect(tree.skipped.count == 1 && tree.skipped[0].contains("escapes"), "\(tree.skipped)")

        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let sent = try client.get()
        let received = try server.get()
        #expect(sent.isComplete && received.isComplete)
        #expect(sent.succeeded == tree.entries.count)
        var expected = shape(of: scratch.sub("src"))
        expected.removeValue(forKey: "odd tree/escapes")
        let actual = shape(of: scratch.sub("dst"))
        for (path, entry) in expected {
            #expect(actual[path] == entry, "\(path): expected \(entry), got \(actual[path].map(\.description) ?? "nothing")")
        }
        #expect(Set(actual.keys) == Set(expected.keys))
    }

    @Test(
        "A file that shrinks or goes after the offer fails alone, with the sender's reason on both sides; the rest arrives",
        .timeLimit(.minutes(1)), arguments: StackKind.allCases, [6 << 20, 48 << 10])
    func unreadableFileFailsAlone(_ kind: StackKind, size: Int) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        let (shrinking, removed, kept) = (scratch.sub("log.bin"), scratch.sub("gone.bin"), scratch.sub("kept.bin"))
        for (index, path) in [shrinking, removed, kept].enumerated() {
            try Data(pattern(size, seed: 5 + index)).write(to: URL(fileURLWithPath: path))
        }
        let tree = try SourceTree.scan([shrinking, removed, kept])
        // Other programs change them between the scan and the send (a log rotated, a file
        // deleted): large files go alone on a stream, small ones in a Batch sent early.
        #expect(truncate(shrinking, off_t(size / 3)) == 0)
        #expect(unlink(removed) == 0)

        let (sending, receiving) = (TransferProgress(), TransferProgress())
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst"), progress: receiving))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree, progress: sending))
        })
        let sent = try client.get(), received = try server.get()
        let shrank = "'log.bin' shrank while it was being sent (it ended after \(size / 3) of the \(size) bytes offered)"
        let reasons = ["log.bin": shrank, "gone.bin": "cannot open 'gone.bin': No such file or directory"]
        #expect(sent.failures.count == 2 && received.failures.count == 2)
        for (path, error) in sent.failures {
            #expect(error.code == .io && error.message.hasPrefix(reasons[path] ?? "?"), "\(path): \(error.message) | \(reasons[path] ?? "?")")
        }
        for (path, error) in received.failures {
            #expect(error.code == .io && error.message.hasPrefix("the sender: " + (reasons[path] ?? "?")), "\(path): \(error.message)")
        }
        #expect(sent.succeeded == 1 && received.succeeded == 1)
        #expect(readFile(scratch.sub("dst/kept.bin")) == pattern(size, seed: 7))
        #expect(!exists(scratch.sub("dst/log.bin")) && !exists(scratch.sub("dst/gone.bin")))
        // What arrived of the file that shrank stays resumable when it has a journal (over
        // 1 MiB), and is removed when it has none.
        #expect(exists(scratch.sub("dst/.log.bin.qxfer-partial")) == (size > 1 << 20))
        // What the given-up files would have sent left the progress totals: both end at 100 %.
        #expect(sending.totalBytes == sending.transferredBytes, "\(sending.totalBytes) \(sending.transferredBytes)")
        #expect(receiving.totalBytes == receiving.transferredBytes, "\(receiving.totalBytes) \(receiving.transferredBytes)")
    }

    @Test(
        "A data stream reset before the sender's Error reaches the receiver: it reports the Error, or, with none, the reset after a grace",
        .timeLimit(.minutes(1)), arguments: [true, false])
    func resetBeforeReason(_ givesReason: Bool) async throws {
        let (scratch, dst) = try HostileNumbersTests.emptyFolder()
        defer { scratch.cleanup() }
        // What a sender whose read failed mid-file does, with the reset made to overtake the
        // Error (QUIC orders neither before the other).
        let (server, _) = try await HostileNumbersTests.accepted(.quic, [HostileSenderTests.file(["log.bin"], size: 1000)], dst: dst) { peer, _ in
            let data = try await peer.openDataStream()
            try await data.send(.fileData(FileData(entry: 0, offset: 0, bytes: pattern(500))))
            // Once it is there: a stream reset before any of its data arrived is never seen.
            while !exists(dst + "/.log.bin.qxfer-partial") { try await Task.sleep(for: .milliseconds(10)) }
            data.reset()
            try await Task.sleep(for: .milliseconds(500))
            if givesReason { try await peer.send(.error(Refusal(TransferError(.io, "'log.bin' could not be read: Input/output error")))) }
            return data
        }
        let received = #expect(throws: (any Error).self) { try server.get() }.map { "\($0)" } ?? "nothing"
        if givesReason {
            #expect(received.contains("the sender: 'log.bin' could not be read: Input/output error"), "\(received)")
        } else {
            #expect(received.contains("the sender stopped with 1 file unfinished (the peer abandoned the stream"), "\(received)")
        }
        #expect(!exists(dst + "/log.bin"))
    }

    @Test(
        "A file written to after the offer is sent as far as its offered size and reported changed; an untouched one is not",
        .timeLimit(.minutes(1)), arguments: StackKind.allCases, [6 << 20, 48 << 10])
    func changedFile(_ kind: StackKind, size: Int) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        let original = pattern(size, seed: 7)
        for change in ["none", "appended", "rewritten"] {
            let source = scratch.sub("\(change).bin")
            try Data(original).write(to: URL(fileURLWithPath: source))
            let tree = try SourceTree.scan([source])
            // Another program writes to it between the scan and the send: a log that grows, or
            // the same bytes rewritten (same size, a new modification time).
            switch change {
            case "appended":
                let handle = try #require(FileHandle(forWritingAtPath: source))
                try handle.seekToEnd()
                try handle.write(contentsOf: Data(repeating: 0x41, count: 1000))
                try handle.close()
            case "rewritten":
                var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
                #expect(utimensat(AT_FDCWD, source, &times, 0) == 0)
            default: break
            }
            let events = Locked<[String]>([])
            let progress = TransferProgress { event in
                if case .changed(let path, let sent) = event { events.withLock { $0.append("\(path) \(sent)") } }
            }
            let (server, client) = try await withConnectedPair(kind, receive: { peer in
                try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
            }, send: { peer in
                try await peer.runSender(TransferSender(tree: tree, progress: progress))
            })
            #expect(try client.get().isComplete && server.get().isComplete)
            #expect(events.withLock { $0 } == (change == "none" ? [] : ["\(change).bin \(size)"]), "\(change)")
            // What arrived is the file as offered, verified: its first `size` bytes.
            #expect(try Data(contentsOf: URL(fileURLWithPath: scratch.sub("dst/\(change).bin"))) == Data(original), "\(change)")
        }
    }

    @Test("What a folder holds that qxfer/1 does not carry is skipped; names it cannot carry are counted as unsent data; a pipe named alone is an error")
    func skippedAndUnsent() throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let top = scratch.sub("mixed")
        try FileManager.default.createDirectory(atPath: top, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: top + "/plain.txt", contents: Data("kept\n".utf8))
        _ = FileManager.default.createFile(atPath: top + "/bell\u{07}name", contents: Data("control\n".utf8))
        // A name that is not UTF-8 (0xFF), made through the raw bytes.
        let undecodable = Array((top + "/latin1-").utf8) + [0xFF, 0]
        let descriptor = undecodable.withUnsafeBufferPointer { open(UnsafeRawPointer($0.baseAddress!).assumingMemoryBound(to: CChar.self), O_CREAT | O_WRONLY, 0o644) }
        #expect(descriptor >= 0)
        close(descriptor)
        #expect(mkfifo(top + "/pipe", 0o644) == 0)
        try FileManager.default.createSymbolicLink(atPath: top + "/out", withDestinationPath: "/etc/passwd")
        // A link inside the tree whose target is not UTF-8: decoded with repair it would have
        // arrived pointing at "latin1-\u{FFFD}", another name.
        let target = Array("latin1-".utf8) + [0xFF, 0]
        #expect(target.withUnsafeBufferPointer { symlink(UnsafeRawPointer($0.baseAddress!).assumingMemoryBound(to: CChar.self), top + "/to-latin1") } == 0)

        let tree = try SourceTree.scan([top])
        #expect(tree.entries.map { $0.path.joined(separator: "/") } == ["mixed", "mixed/plain.txt"])
        #expect(tree.skipped.count == 5, "\(tree.skipped)")
        // The FIFO and the escaping link hold no data qxfer carries; the two files and the link
        // inside the tree do.
        #expect(tree.unsentForTheirNames == 3)
        // Each named, its undecodable bytes shown as `ls -b` would.
        #expect(tree.skipped.contains("'\(top)/latin1-\\xff': the name is not valid UTF-8, as qxfer/1 names must be; not sent"), "\(tree.skipped)")
        #expect(tree.skipped.contains { $0.hasSuffix("/to-latin1': symlink to 'latin1-\\xff', a target that is not valid UTF-8, which qxfer/1 cannot carry; not sent") }, "\(tree.skipped)")
        #expect(try SourceTree.scan([top + "/plain.txt"]).unsentForTheirNames == 0)
        #expect(tree.skipped.contains { $0.hasSuffix("/pipe': a pipe (FIFO), not a file, folder or symlink; not sent") }, "\(tree.skipped)")
        // Named by the user, a pipe or a device is an error, not an empty send that succeeds.
        let pipe = #expect(throws: TransferError.self) { try SourceTree.scan([top + "/pipe"]) }
        #expect(pipe?.message.contains("it is a pipe (FIFO), not a file or folder") == true, "\(String(describing: pipe))")
        let device = #expect(throws: TransferError.self) { try SourceTree.scan(["/dev/null"]) }
        #expect(device?.message.contains("'/dev/null': it is a device") == true, "\(String(describing: device))")
    }

    @Test("A folder named on the command line whose own name is not UTF-8 (reached through a link, or as `send .` from inside it) is refused before anything is offered")
    func topLevelNameNotUTF8() throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let folder = Array(scratch.sub("d").utf8) + [0xE9, 0]
        let withFolder = { (call: (UnsafePointer<CChar>) -> Int32) in folder.withUnsafeBufferPointer { call(UnsafeRawPointer($0.baseAddress!).assumingMemoryBound(to: CChar.self)) } }
        #expect(withFolder { mkdir($0, 0o755) } == 0)
        defer { _ = withFolder { rmdir($0) } }
        #expect(withFolder { symlink($0, scratch.sub("link")) } == 0)
        let error = #expect(throws: TransferError.self) { try SourceTree.scan([scratch.sub("link")]) }
        #expect(error?.message == "cannot send '\(scratch.sub("link"))': its name 'd\\xe9' is not valid UTF-8, as qxfer/1 names must be", "\(String(describing: error))")
    }

    @Test("A folder deeper than qxfer/1's 64 levels stays behind, named and counted as unsent; the rest is offered")
    func tooDeepFolderIsSkipped() throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        // top/1/2/…/70, a file at level 3 and one at the bottom.
        let levels = (1...70).map(String.init)
        try FileManager.default.createDirectory(atPath: scratch.sub((["top"] + levels).joined(separator: "/")), withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: scratch.sub("top/1/2/shallow.txt"), contents: Data("up here\n".utf8))
        _ = FileManager.default.createFile(atPath: scratch.sub((["top"] + levels + ["bottom.txt"]).joined(separator: "/")), contents: Data("down there\n".utf8))

        let tree = try SourceTree.scan([scratch.sub("top")])
        #expect(tree.entries.map(\.path.count).max() == ProtocolLimits.maximumDepth)
        #expect(tree.entries.contains { $0.path == ["top", "1", "2", "shallow.txt"] })
        #expect(tree.unsentForTheirNames == 1)
        let deep = scratch.sub((["top"] + levels.prefix(64)).joined(separator: "/"))
        #expect(tree.skipped == ["'\(deep)': nested deeper than 64 levels, which qxfer/1 cannot carry; not sent"], "\(tree.skipped)")
    }

    /// Makes folders `names` one inside the other under `base` (through directory descriptors:
    /// their full path may be longer than PATH_MAX), with an empty file `file` at the bottom.
    static func makeChain(_ base: String, _ names: [String], file: String) throws {
        var folder = open(base, O_RDONLY | O_DIRECTORY)
        try #require(folder >= 0)
        for name in names {
            try #require(mkdirat(folder, name, 0o755) == 0, "mkdirat: \(String(cString: strerror(errno)))")
            let next = openat(folder, name, O_RDONLY | O_DIRECTORY)
            close(folder)
            folder = next
            try #require(folder >= 0)
        }
        let created = openat(folder, file, O_WRONLY | O_CREAT, 0o644)
        try #require(created >= 0)
        close(created)
        close(folder)
    }

    @Test("A path longer than qxfer/1's 4095 bytes, or than this system opens from the folder named, stays behind named and counted; the rest is offered")
    func tooLongPathIsSkipped() throws {
        let scratch = TempDir()
        defer { _ = run("/bin/rm", ["-rf", scratch.path]) }  // GNU rm walks paths beyond PATH_MAX
        try #require(scratch.path.utf8.count < 200)
        try FileManager.default.createDirectory(atPath: scratch.sub("top"), withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: scratch.sub("top/near.txt"), contents: Data("near\n".utf8))
        // "top/" and 18 folders of 200 bytes and one of 218: 3 840 bytes; the next, of 255, makes
        // 4 096. The folder above it is still within PATH_MAX from here.
        let folders = Array(repeating: String(repeating: "d", count: 200), count: 18) + [String(repeating: "e", count: 218)]
        try Self.makeChain(scratch.sub("top"), folders + [String(repeating: "f", count: 255)], file: "far.txt")
        let tree = try SourceTree.scan([scratch.sub("top")])
        #expect(tree.entries.map { $0.path.joined(separator: "/").utf8.count }.max() == 3840)
        #expect(tree.entries.contains { $0.path == ["top", "near.txt"] })
        #expect(tree.unsentForTheirNames == 1)
        #expect(tree.skipped.count == 1 && tree.skipped[0].hasSuffix("': a path of 4096 bytes, longer than the 4095 qxfer/1 carries; not sent"), "\(tree.skipped)")
        #expect(tree.skipped[0].utf8.count < 300, "the path in the message is shortened")

        // Named by a long path, a folder whose relative paths fit but whose full ones do not.
        let named = scratch.sub((["top"] + folders).joined(separator: "/"))
        try FileManager.default.createDirectory(atPath: named + "/tree", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: named + "/tree/ok.txt", contents: Data("ok\n".utf8))
        try Self.makeChain(named + "/tree", [String(repeating: "g", count: 255)], file: "beyond.txt")
        let beyond = try SourceTree.scan([named + "/tree"])
        #expect(beyond.entries.map(\.path) == [["tree"], ["tree", "ok.txt"]])
        #expect(beyond.unsentForTheirNames == 1)
        #expect(beyond.skipped.count == 1 && beyond.skipped[0].contains("the full path is longer than this system opens (PATH_MAX)"), "\(beyond.skipped)")
    }

    @Test("Kernel files, whose size says nothing of their content, arrive read to their end beside a sparse file", arguments: StackKind.allCases)
    func kernelFilesArriveWhole(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        // procfs says 0 bytes, sysfs 4096. The sparse file makes the offer one that may send
        // Zeros, which a file of unknown size must never wait for.
        let disk = try SparseFileTests.makeSparseFile(scratch.sub("disk.img"), size: 8 << 20, runs: [(0, 4096)])
        let kernelFiles = ["/proc/version", "/sys/class/net/lo/mtu"]
        let tree = try SourceTree.scan(kernelFiles + [scratch.sub("disk.img")])
        #expect(tree.entries.map { $0.flags.contains(.sizeUnknown) } == [true, true, false])
        #expect(tree.mayHaveHoles)

        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(try client.get().isComplete && server.get().isComplete)
        for path in kernelFiles {
            // Read as the sender does, to the end: the file's size would say 0 or 4096 bytes.
            let fd = open(path, O_RDONLY)
            #expect(fd >= 0)
            var content: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while case let n = read(fd, &buffer, buffer.count), n > 0 { content += buffer[..<n] }
            close(fd)
            #expect(!content.isEmpty && readFile(scratch.sub("dst/" + path.split(separator: "/").last!)) == content, "\(path)")
        }
        #expect(readFile(scratch.sub("dst/disk.img")) == disk)
    }

    @Test("A kernel file whose read fails is skipped and named inside a folder, and an error named alone")
    func unreadableKernelFiles() throws {
        // Loopback has no link speed: reading its `speed` fails with EINVAL, whatever its mode says.
        let tree = try SourceTree.scan(["/sys/class/net/lo"])
        #expect(tree.skipped.contains("'/sys/class/net/lo/speed': cannot read: Invalid argument; not sent"), "\(tree.skipped)")
        #expect(tree.unreadable >= 1)
        let mtu = tree.entries.first { $0.path == ["lo", "mtu"] }
        #expect(mtu?.flags.contains(.sizeUnknown) == true)
        #expect(!tree.entries.contains { $0.path == ["lo", "speed"] })
        let alone = #expect(throws: TransferError.self) { try SourceTree.scan(["/sys/class/net/lo/speed"]) }
        #expect(alone?.message == "cannot read '/sys/class/net/lo/speed': Invalid argument", "\(String(describing: alone))")
    }

    @Test("Sending again finds identical files present and moves no data", arguments: StackKind.allCases)
    func presentFilesAreNotSentAgain(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        try Data(pattern(2 << 20)).write(to: URL(fileURLWithPath: scratch.sub("file.bin")))
        try Data(pattern(2 << 20)).write(to: URL(fileURLWithPath: scratch.sub("dst/file.bin")))
        let tree = try SourceTree.scan([scratch.sub("file.bin")])
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(try client.get().isComplete && client.get().transferredBytes == 0)
        #expect(try server.get().transferredBytes == 0)

        // Same size, other content: reported, left alone.
        try Data(pattern(2 << 20, seed: 1)).write(to: URL(fileURLWithPath: scratch.sub("dst/file.bin")))
        let (_, second) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let summary = try second.get()
        #expect(summary.failures.first?.error.code == .exists)
        #expect(readFile(scratch.sub("dst/file.bin")) == pattern(2 << 20, seed: 1))
    }

    @Test("A file or a link where the receiver is offered a folder skips that folder and what it holds, not the whole offer; nothing goes through the link", arguments: StackKind.allCases)
    func somethingElseWhereAFolderIsOffered(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        for folder in ["tree/file-here/inner", "tree/link-here", "tree/fine", "dst/tree", "outside"] {
            try FileManager.default.createDirectory(atPath: scratch.sub(folder), withIntermediateDirectories: true)
        }
        for file in ["tree/file-here/a", "tree/file-here/inner/b", "tree/link-here/c", "tree/fine/d", "tree/e"] {
            try Data(file.utf8).write(to: URL(fileURLWithPath: scratch.sub(file)))
        }
        try Data("kept".utf8).write(to: URL(fileURLWithPath: scratch.sub("dst/tree/file-here")))
        #expect(symlink(scratch.sub("outside"), scratch.sub("dst/tree/link-here")) == 0)
        let tree = try SourceTree.scan([scratch.sub("tree")])
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let sent = try client.get(), received = try server.get()
        // Skipped: the two folders and the three files inside them; everything else arrived.
        let blocked = ["tree/file-here", "tree/file-here/a", "tree/file-here/inner", "tree/file-here/inner/b", "tree/link-here", "tree/link-here/c"]
        #expect(sent.failures.map(\.path).sorted() == blocked, "\(sent.failures)")
        #expect(sent.failures.allSatisfy { $0.error.code == .exists }, "\(sent.failures)")
        // The sender names the folder in the way once; what it holds points to that folder.
        let reasons = Dictionary(uniqueKeysWithValues: sent.failures.map { ($0.path, $0.error.message) })
        #expect(reasons["tree/link-here"]?.hasPrefix("the receiver already has something else under that name") == true, "\(reasons)")
        #expect(reasons["tree/file-here/inner/b"] == "it is inside 'tree/file-here', which was not transferred either", "\(reasons)")
        #expect(received.failures.count == blocked.count, "\(received.failures)")
        #expect(readFile(scratch.sub("dst/tree/fine/d")) == Array("tree/fine/d".utf8))
        #expect(readFile(scratch.sub("dst/tree/e")) == Array("tree/e".utf8))
        #expect(readFile(scratch.sub("dst/tree/file-here")) == Array("kept".utf8))
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.sub("outside")).isEmpty)
    }

    @Test("A transfer cut off midway resumes from the receiver's checkpoint and ends identical", arguments: StackKind.allCases)
    func resumeAfterInterruption(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        let size = 48 << 20
        let content = pattern(size, seed: 3)
        try Data(content).write(to: URL(fileURLWithPath: scratch.sub("big.bin")))
        let tree = try SourceTree.scan([scratch.sub("big.bin")])

        // The sender gives up after 40 MiB: the receiver keeps a checkpointed partial.
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            let progress = TransferProgress()
            let sender = TransferSender(tree: tree, progress: progress)
            return try await withThrowingTaskGroup(of: TransferSummary?.self) { group in
                group.addTask { try await peer.runSender(sender) }
                group.addTask {
                    while progress.transferredBytes < 40 << 20 { try await Task.sleep(for: .milliseconds(5)) }
                    return nil
                }
                let first = try await group.next()!
                group.cancelAll()
                return first
            }
        })
        if case .success(let finished?) = client { Issue.record("the sender was meant to be cut off but finished: \(finished.transferredBytes) bytes") }
        #expect(throws: (any Error).self) { try server.get() }
        #expect(!exists(scratch.sub("dst/big.bin")), "a partial file got the final name")
        #expect(exists(scratch.sub("dst/.big.bin.qxfer-partial")))

        let (_, resumed) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let summary = try resumed.get()
        #expect(summary.isComplete)
        #expect(summary.resumedBytes >= 16 << 20, "resumed only \(summary.resumedBytes) bytes")
        #expect(summary.transferredBytes + summary.resumedBytes == UInt64(size))
        #expect(readFile(scratch.sub("dst/big.bin")) == content)
        #expect(!exists(scratch.sub("dst/.big.bin.qxfer-partial")) && !exists(scratch.sub("dst/.big.bin.qxfer-journal")))
    }

    /// A result's TransferError as "code: message"; nil for a success or another error.
    static func failure<T>(_ result: Result<T, any Error>) -> String? {
        guard case .failure(let error as TransferError) = result else { return nil }
        return "\(error.code): \(error.message)"
    }

    @Test("A failure of the receiver's own ends an accepted transfer at once, the sender stopped with its reason", arguments: StackKind.allCases)
    func localFailureEndsTheTransfer(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        let size = 48 << 20
        // Not `pattern`: 48 MiB of it take seconds of a cooperative thread in a debug build, which
        // starves the deadline tests running beside this one.
        try Data(repeating: 0x5A, count: size).write(to: URL(fileURLWithPath: scratch.sub("big.bin")))
        let tree = try SourceTree.scan([scratch.sub("big.bin")])
        let reason = "the reader of standard output closed it; the transfer stopped"
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            var receiver = TransferReceiver(directory: scratch.sub("dst"))
            let progress = receiver.progress
            receiver.localFailure = {
                // Once 4 MiB have come: under way, far from the end.
                while progress.transferredBytes < 4 << 20 {
                    guard (try? await Task.sleep(for: .milliseconds(2))) != nil else { return nil }
                }
                return TransferError(.io, reason)
            }
            return try await peer.runReceiver(receiver)
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        // TransferError's == compares codes only: the messages are compared here.
        #expect(Self.failure(server) == "io: " + reason)
        #expect(Self.failure(client) == "io: the receiver: " + reason)
        #expect(!exists(scratch.sub("dst/big.bin")))
    }

    /// A scratch folder with an empty `dst` and `f.bin` of `count` bytes, and the tree to send it.
    static func oneFile(repeating byte: UInt8, count: Int) throws -> (TempDir, SourceTree) {
        let scratch = TempDir()
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        try Data(repeating: byte, count: count).write(to: URL(fileURLWithPath: scratch.sub("f.bin")))
        return (scratch, try SourceTree.scan([scratch.sub("f.bin")]))
    }

    @Test("The sender hears Complete only once the receiver's beforeComplete is done; its failure ends the transfer with the reason", arguments: StackKind.allCases)
    func beforeCompleteHoldsComplete(_ kind: StackKind) async throws {
        let (scratch, tree) = try Self.oneFile(repeating: 0x33, count: 300_000)
        defer { scratch.cleanup() }
        let reason = "the reader of standard output closed it; the transfer stopped"
        for fails in [false, true] {
            let senderDone = Locked(false), senderDoneDuringWait = Locked<Bool?>(nil)
            let (server, client) = try await withConnectedPair(kind, receive: { peer in
                var receiver = TransferReceiver(directory: scratch.sub("dst"), overwrite: true)
                receiver.beforeComplete = {
                    // Whatever the timing, a sender that finished by now did so without Complete.
                    try? await Task.sleep(for: .milliseconds(300))
                    senderDoneDuringWait.withLock { $0 = senderDone.withLock { $0 } }
                    return fails ? TransferError(.io, reason) : nil
                }
                return try await peer.runReceiver(receiver)
            }, send: { peer in
                defer { senderDone.withLock { $0 = true } }
                return try await peer.runSender(TransferSender(tree: tree))
            })
            #expect(senderDoneDuringWait.withLock { $0 } == false, "the sender finished while the receiver held Complete back")
            if fails {
                #expect(Self.failure(server) == "io: " + reason)
                #expect(Self.failure(client) == "io: the receiver: " + reason)
            } else {
                #expect(try client.get().isComplete && server.get().isComplete)
            }
            #expect(exists(scratch.sub("dst/f.bin")), "verified and durable before the wait")
        }
    }

    @Test("A confirm hook that throws declines the offer with its reason, which the sender is told", arguments: StackKind.allCases)
    func declineWithReason(_ kind: StackKind) async throws {
        let (scratch, tree) = try Self.oneFile(repeating: 0x45, count: 1000)
        defer { scratch.cleanup() }
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst"), confirm: { _ in
                throw TransferError(.refused, "nobody is here to say yes")
            }))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(Self.failure(client) == "refused: the receiver declined: nobody is here to say yes")
        #expect(Self.failure(server) == "refused: nobody is here to say yes")
        #expect(!exists(scratch.sub("dst/f.bin")))
    }

    @Test("A sender gone while beforeComplete holds Complete back leaves the receiver's transfer complete", arguments: StackKind.allCases)
    func senderGoneBeforeComplete(_ kind: StackKind) async throws {
        let (scratch, tree) = try Self.oneFile(repeating: 0x44, count: 300_000)
        defer { scratch.cleanup() }
        let holding = Locked(false), senderGone = Locked(false)
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            var receiver = TransferReceiver(directory: scratch.sub("dst"))
            receiver.beforeComplete = {
                holding.withLock { $0 = true }
                for _ in 0..<500 where !senderGone.withLock({ $0 }) { try? await Task.sleep(for: .milliseconds(10)) }
                // The sender's close reaches this side.
                try? await Task.sleep(for: .milliseconds(300))
                return nil
            }
            return try await peer.runReceiver(receiver)
        }, send: { peer in
            // Interrupted (Ctrl-C) while the receiver holds Complete back.
            defer { senderGone.withLock { $0 = true } }
            return try await withThrowingTaskGroup(of: TransferSummary?.self) { group in
                group.addTask { try await peer.runSender(TransferSender(tree: tree)) }
                group.addTask {
                    while !holding.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(10)) }
                    return nil
                }
                defer { group.cancelAll() }
                return try await group.next()!
            }
        })
        #expect(try client.get() == nil, "the sender finished before the receiver's Complete")
        let summary = try server.get()
        #expect(summary.isComplete && summary.succeeded == 1)
        // Over TCP the kernel may take the Complete after the sender has gone.
        if kind == .quic { #expect(summary.senderLeftBeforeComplete) }
        #expect(exists(scratch.sub("dst/f.bin")))
    }

    @Test("A resume prefix that differs from the sender's file restarts from byte 0", arguments: StackKind.allCases)
    func mismatchedPrefixRestarts(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        let content = pattern(3 << 20, seed: 5)
        try Data(content).write(to: URL(fileURLWithPath: scratch.sub("f.bin")))
        let tree = try SourceTree.scan([scratch.sub("f.bin")])
        // A partial of other bytes, with a journal vouching for them (an older version of the file).
        let store = FileStore(directory: try TargetDirectory(path: dst), checkpointInterval: 1 << 20)
        let entry = tree.entries[0]
        let target = FileTarget(path: try SafePath(validating: ["f.bin"]), size: entry.size, mode: entry.mode, modificationTime: entry.modificationTime, algorithm: .xxh3_128)
        let writer = try store.openWriter(for: target)
        try writer.write(pattern(2 << 20, seed: 9), at: 0)
        writer.abandon()

        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: dst))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let summary = try client.get()
        #expect(summary.isComplete)
        #expect(summary.transferredBytes == UInt64(content.count))
        #expect(readFile(dst + "/f.bin") == content)
        // Nothing was resumed after all: neither side may report the discarded prefix as resumed.
        #expect(summary.resumedBytes == 0)
        #expect(try server.get().resumedBytes == 0)
    }

    @Test("A disk that fills up fails the transfer clearly and keeps a resumable partial")
    func diskFull() async throws {
        try #require(getuid() == 0, "mounting a small tmpfs needs root (CI runs as root)")
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("small")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        guard run("/bin/mount", ["-t", "tmpfs", "-o", "size=8m", "tmpfs", dst]) != nil else {
            Issue.record("cannot mount a tmpfs")
            return
        }
        defer { _ = run("/bin/umount", [dst]) }
        let content = pattern(6 << 20, seed: 11)
        try Data(content).write(to: URL(fileURLWithPath: scratch.sub("six.bin")))
        let tree = try SourceTree.scan([scratch.sub("six.bin")])

        // The offer fits when checked; the disk fills up just after (another program writing).
        let (server, client) = try await withConnectedPair(.tls, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: dst, confirm: { _ in
                _ = FileManager.default.createFile(atPath: dst + "/filler", contents: Data(count: 5 << 20))
                return true
            }))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(throws: TransferError(.noSpace, "")) { try server.get() }
        #expect(throws: TransferError(.noSpace, "")) { try client.get() }
        #expect(!exists(dst + "/six.bin"))
        #expect(exists(dst + "/.six.bin.qxfer-partial") && exists(dst + "/.six.bin.qxfer-journal"))

        try FileManager.default.removeItem(atPath: dst + "/filler")
        let (_, resumed) = try await withConnectedPair(.tls, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: dst))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let summary = try resumed.get()
        #expect(summary.resumedBytes > 0, "nothing of the first attempt was kept")
        #expect(readFile(dst + "/six.bin") == content)
    }
}
