import Foundation
import LinuxSystem
import QXfer
@testable import QXferTransfer
import Testing

/// A sender that reconnects while its old connection still looks alive to the receiver (a
/// stalled TCP connection) takes the transfer over (docs/PROTOCOL.md §6).
@Suite("A reconnecting sender takes over its stalled transfer")
struct TakeoverTests {
    static let alice = Fingerprint(parsing: String(repeating: "a1", count: 32))!
    static let bob = Fingerprint(parsing: String(repeating: "b2", count: 32))!

    @Test("The claim rule: the same sender supersedes, another sender or an anonymous one does not")
    func claimRule() {
        var table = TargetClaimTable()
        #expect(table.claim(["x", "y"], for: 1, sender: Self.alice) == .granted(contested: []))
        // Another sender supersedes nobody and does not get what is held.
        #expect(table.claim(["y", "z"], for: 2, sender: Self.bob) == .granted(contested: ["y"]))
        #expect(table.holder(of: "z") == 2)
        // A sender without a certificate cannot be recognised: it supersedes nobody.
        #expect(table.claim(["x"], for: 3, sender: nil) == .granted(contested: ["x"]))
        // The same sender again: the old transfer must stop first; nothing is granted yet.
        #expect(table.claim(["y"], for: 4, sender: Self.alice) == .supersede([1]))
        #expect(table.holder(of: "y") == 1)
        table.release(1)
        #expect(table.claim(["y"], for: 4, sender: Self.alice) == .granted(contested: []))
        #expect(table.holder(of: "y") == 4 && table.holder(of: "x") == nil)
        // A superseded transfer never holds anything again.
        #expect(table.claim(["x"], for: 1, sender: Self.alice) == .granted(contested: ["x"]))
        #expect(table.holder(of: "x") == nil)
        // Bob's own second connection takes over z from his first.
        #expect(table.claim(["z"], for: 5, sender: Self.bob) == .supersede([2]))
    }

    @Test("A second connection of the same sender resumes what the stalled first one wrote", arguments: StackKind.allCases)
    func reconnectTakesOver(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        let size = 24 << 20
        let written = 10 << 20
        let content = pattern(size, seed: 7)
        try Data(content).write(to: URL(fileURLWithPath: scratch.sub("big.bin")))
        let tree = try SourceTree.scan([scratch.sub("big.bin")])

        let receiver = TransferReceiver(directory: dst)
        let outcome = try await withTwoConnections(kind, receiver: receiver, stalled: { peer in
            // Offer, send the first 10 MiB, then go silent with the connection open.
            try await peer.send(.offer(Offer(algorithm: .xxh3_128, entries: tree.entries)))
            guard case .accept? = try await peer.receiveMessage() else { throw TransferError(.protocolViolation, "no accept") }
            let data = try await peer.openDataStream()
            try await sendData(content, 0..<written, of: 0, on: data)
            let reply = try await peer.receiveMessage()
            withExtendedLifetime(data) {}  // open, not ended, while the connection stalls
            return reply
        }, whenStalled: {
            partialSize(scratch.sub("dst/.big.bin.qxfer-partial")) >= written
        }, fresh: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })

        // The stalled connection was told why it ends, so its sender does not reconnect in turn.
        switch try outcome.stalled.get() {
        case .error(let refusal)?: #expect(refusal.code == .cancelled && refusal.message.contains("took over"), "\(refusal.message)")
        case let other: Issue.record("the stalled sender got \(String(describing: other))")
        }
        // On the receiver, one transfer ends superseded and the other completes.
        let superseded = outcome.receivers.filter { if case .failure(let error) = $0 { error is TransferSuperseded } else { false } }
        let completed = outcome.receivers.compactMap { try? $0.get() }
        #expect(superseded.count == 1 && completed.count == 1, "the receiver's results: \(outcome.receivers)")
        #expect(completed.first?.resumedBytes == UInt64(written))
        let summary = try outcome.fresh.get()
        #expect(summary.isComplete)
        #expect(summary.resumedBytes == UInt64(written), "resumed \(summary.resumedBytes) of the \(written) bytes the first connection wrote")
        #expect(summary.transferredBytes == UInt64(size - written))
        #expect(readFile(scratch.sub("dst/big.bin")) == content)
        #expect(!exists(scratch.sub("dst/.big.bin.qxfer-partial")) && !exists(scratch.sub("dst/.big.bin.qxfer-journal")))
    }

    @Test("Another sender's offer of a file being received is answered busy: nothing of it is sent, the first goes on", arguments: StackKind.allCases)
    func anotherSenderIsToldBusy(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        let size = 24 << 20
        let written = 17 << 20  // past the first checkpoint (16 MiB): a journal the second could resume from
        let content = pattern(size, seed: 11)
        let small = pattern(1000, seed: 12)
        try Data(small).write(to: URL(fileURLWithPath: scratch.sub("done.txt")))
        try Data(content).write(to: URL(fileURLWithPath: scratch.sub("big.bin")))
        let tree = try SourceTree.scan([scratch.sub("done.txt"), scratch.sub("big.bin")])
        let secondDone = Locked(false)

        let outcome = try await withTwoConnections(kind, receiver: TransferReceiver(directory: dst), stalled: { peer in
            // The first sender finishes done.txt, sends 17 MiB of big.bin, waits until the
            // second has had its answer, then finishes big.bin.
            try await peer.send(.offer(Offer(algorithm: .xxh3_128, entries: tree.entries)))
            guard case .accept? = try await peer.receiveMessage() else { throw TransferError(.protocolViolation, "no accept") }
            let data = try await peer.openDataStream()
            try await data.send(.fileData(FileData(entry: 0, offset: 0, bytes: small)))
            try await data.send(.fileDone(FileDone(entry: 0, size: UInt64(small.count), algorithm: .xxh3_128, digest: DigestAlgorithm.xxh3_128.digest(of: small))))
            guard case .verified(entry: 0)? = try await peer.receiveMessage() else { throw TransferError(.protocolViolation, "done.txt not verified") }
            let data2 = try await peer.openDataStream()  // one file per data stream (§3.6)
            try await sendData(content, 0..<written, of: 1, on: data2)
            while !secondDone.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(10)) }
            try await sendData(content, written..<size, of: 1, on: data2)
            try await data2.send(.fileDone(FileDone(entry: 1, size: UInt64(size), algorithm: .xxh3_128, digest: DigestAlgorithm.xxh3_128.digest(of: content))))
            return try await peer.receiveMessage()
        }, whenStalled: {
            partialSize(scratch.sub("dst/.big.bin.qxfer-partial")) >= written
        }, fresh: { peer in
            defer { secondDone.withLock { $0 = true } }
            return try await peer.runSender(TransferSender(tree: tree))
        }, freshIdentity: otherClientIdentity)

        // The second sender: big.bin busy, nothing sent; done.txt, finished by the first
        // transfer, compared as any existing file is.
        let second = try outcome.fresh.get()
        #expect(second.failures.map(\.path) == ["big.bin"] && second.failures.map(\.error.code) == [.busy], "\(second.failures)")
        #expect(second.succeeded == 1)
        // At most done.txt's bytes, which may go early, before the answer (§3.7).
        #expect(second.transferredBytes <= UInt64(small.count) && second.resumedBytes == 0, "sent \(second.transferredBytes), resumed \(second.resumedBytes)")
        if case .verified(entry: 1)? = try outcome.stalled.get() {} else { Issue.record("the first sender got \(String(describing: outcome.stalled))") }
        #expect(readFile(scratch.sub("dst/big.bin")) == content)
    }
}

/// A sender identity other than ``clientIdentity``.
private let otherClientIdentity = try! HostIdentity.ephemeral(commonName: "another sender")

/// Sends `content[range]` as `entry`'s FileData on `stream`, in chunks as large as allowed.
private func sendData(_ content: [UInt8], _ range: Range<Int>, of entry: UInt32, on stream: any TransferPeer) async throws {
    var offset = range.lowerBound
    while offset < range.upperBound {
        let end = min(range.upperBound, offset + ProtocolLimits.maximumChunkSize)
        try await stream.send(.fileData(FileData(entry: entry, offset: UInt64(offset), bytes: Array(content[offset..<end]))))
        offset = end
    }
}

private func partialSize(_ path: String) -> Int {
    var info = stat()
    return stat(path, &info) == 0 ? Int(info.st_size) : 0
}

/// What the two connections of ``withTwoConnections`` ended with.
struct TwoConnections<Stalled: Sendable, Fresh: Sendable>: Sendable {
    var stalled: Result<Stalled, any Error>
    /// Both transfers' results on the receiver, in the order they ended.
    var receivers: [Result<TransferSummary, any Error>]
    var fresh: Result<Fresh, any Error>
}

/// One receiver (shared by both connections, as `qxfer recv` shares it), a first client that
/// runs `stalled`, and once `whenStalled` holds, a second client (with the same identity unless
/// `freshIdentity` says otherwise) that runs `fresh`.
func withTwoConnections<Stalled: Sendable, Fresh: Sendable>(
    _ kind: StackKind, receiver: TransferReceiver,
    stalled: @escaping @Sendable (any TransferPeer) async throws -> Stalled,
    whenStalled: @escaping @Sendable () -> Bool,
    fresh: @escaping @Sendable (any TransferPeer) async throws -> Fresh,
    freshIdentity: HostIdentity = clientIdentity
) async throws -> TwoConnections<Stalled, Fresh> {
    switch kind {
    case .quic: try await twoConnections(QUIC(), receiver, stalled, whenStalled, fresh, freshIdentity)
    case .tls: try await twoConnections(TLS(), receiver, stalled, whenStalled, fresh, freshIdentity)
    }
}

private func twoConnections<Transport: SecureTransport, Stalled: Sendable, Fresh: Sendable>(
    _ transport: Transport, _ receiver: TransferReceiver,
    _ stalled: @escaping @Sendable (any TransferPeer) async throws -> Stalled,
    _ whenStalled: @escaping @Sendable () -> Bool,
    _ fresh: @escaping @Sendable (any TransferPeer) async throws -> Fresh,
    _ freshIdentity: HostIdentity
) async throws -> TwoConnections<Stalled, Fresh> {
    let listener = NetworkListener(on: 0, host: "127.0.0.1") { TLV { transport.identity(serverIdentity) } }
    let (results, continuation) = AsyncStream.makeStream(of: Result<TransferSummary, any Error>.self)
    return try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask {
            try await listener.run { connection in
                let result: Result<TransferSummary, any Error>
                do { result = .success(try await receiver.run(over: connection)) } catch { result = .failure(error) }
                continuation.yield(result)
            }
        }
        let port = try await listener.port
        func connect(as identity: HostIdentity) -> NetworkConnection<TLV<Transport>> {
            NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                TLV { transport.identity(identity).peerFingerprint(serverIdentity.fingerprint) }
            }
        }
        let first = connect(as: clientIdentity)
        async let stalledOutcome: Result<Stalled, any Error> = {
            do { return .success(try await stalled(Peer(connection: first))) } catch { return .failure(error) }
        }()
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(60)
        while !whenStalled() && clock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        let second = connect(as: freshIdentity)
        let freshResult: Result<Fresh, any Error>
        do { freshResult = .success(try await fresh(Peer(connection: second))) } catch { freshResult = .failure(error) }
        let stalledResult = await stalledOutcome
        var ended: [Result<TransferSummary, any Error>] = []
        for await result in results {
            ended.append(result)
            if ended.count == 2 { break }
        }
        first.cancel()
        second.cancel()
        group.cancelAll()
        return TwoConnections(stalled: stalledResult, receivers: ended, fresh: freshResult)
    }
}
