import Foundation
import QXfer
import LinuxSystem
@testable import QXferTransfer
import Testing

/// A receiver shared fairly between senders (issue 66, items 5 and 8): a sender accepted and
/// then dripping is cut off by the minimum data rate and, sooner, whenever another sender's
/// offer needs the memory it holds; the idle limit measures the sender, not the receiver's
/// backlog; a Batch is bounded in frames, so one message cannot buy unbounded work. The limits
/// are made short so each test takes seconds; the peers are far slower than the limits allow.
@Suite("The receiver is shared fairly between senders", .serialized)
struct FairnessTests {
    /// A sender that answers its Accept with one byte of FileData now and then: the idle limit
    /// (30 s here) never fires, the minimum rate does.
    @Test("A drip of FileData after the Accept is cut off by the minimum rate", arguments: StackKind.allCases)
    func dripAfterAccept(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        var receiver = TransferReceiver(directory: scratch.path, idleTimeout: .seconds(30))
        receiver.sendTimeout = .milliseconds(500)
        receiver.minimumDataRate = 64 << 10
        let outcome = try await withDialedReceiver(kind, receiver) { dial in
            try await drip(dial.framed(as: clientIdentity), files: 1, size: 1 << 20, prefix: "dripped", for: .seconds(10))
        }
        let (held, _) = try outcome.client.get()
        #expect(held < .seconds(8), "the dripping sender was held \(held)")
        let ended = try #require(outcome.ended.first)
        #expect(throws: TransferError(.cancelled, "")) { try ended.get() }
        if case .failure(let error as TransferError) = ended {
            #expect(error.message.contains("slower than 64 KiB/s") && !error.message.contains("\n"), "\(error.message)")
        }
        #expect(!exists(scratch.sub("dripped0")), "a partial or file of the drip is left under its final name")
    }

    /// Two dripping senders whose offers hold all the memory offers may take: a third sender
    /// is not declined `busy`, the drippers are cut off to make room (the rate's own cut-off is
    /// far: 20 s).
    @Test("Senders that make no progress cannot hold the offers' memory against a newcomer")
    func drippersYieldTheirMemory() async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        let source = scratch.sub("legit")
        let content = pattern(100_000, seed: 5)
        try Data(content).write(to: URL(fileURLWithPath: source))

        var receiver = TransferReceiver(directory: dst, idleTimeout: .seconds(30))
        receiver.sendTimeout = .seconds(20)
        receiver.minimumDataRate = 64 << 10
        let dripOffer = offer(files: 2000, size: 1, prefix: "a")
        let dripCost = MessageCodec.encodeFrame(.offer(dripOffer)).count * OfferMemory.bytesHeldPerOfferByte
        receiver.offerMemory = OfferMemory(limit: 2 * dripCost)
        let memory = receiver.offerMemory

        let accepted = Locked(0)
        let outcome = try await withDialedReceiver(.tls, receiver, expectedEnds: 3) { dial in
            try await withThrowingTaskGroup(of: Void.self) { drippers in
                for prefix in ["a", "b"] {
                    let identity = try HostIdentity.ephemeral(commonName: "dripper \(prefix)")
                    drippers.addTask {
                        _ = try await drip(dial.framed(as: identity), files: 2000, size: 1, prefix: prefix, for: .seconds(10)) {
                            accepted.withLock { $0 += 1 }
                        }
                    }
                }
                // Both accepted and dripping, behind the rate by more than a second's worth.
                while accepted.withLock({ $0 }) < 2 { try await Task.sleep(for: .milliseconds(50)) }
                try await Task.sleep(for: .seconds(2))
                let sent = try await dial.framed(as: newcomer).runSender(TransferSender(tree: try SourceTree.scan([source])))
                try await drippers.waitForAll()
                return sent
            }
        }
        let sent = try outcome.client.get()
        #expect(sent.succeeded == 1 && sent.failures.isEmpty, "the newcomer: \(sent.failures)")
        #expect(readFile(dst + "/legit") == content)
        let cutOff = outcome.ended.compactMap { result -> String? in
            guard case .failure(let error as TransferError) = result else { return nil }
            return error.message
        }
        // As many as make room, the furthest behind first: here one of the two.
        #expect(cutOff.contains { $0.contains("to make room for another sender") } && !cutOff.contains { $0.contains("busy") }, "\(cutOff)")
        #expect(memory.heldBytes == 0)
    }

    /// One FileData frame of 1 MiB arriving over 4 s, with an idle limit of 2 s: its bytes
    /// keep arriving at the transport, so the sender is not silent, and 256 KiB/s is far above
    /// the minimum rate.
    @Test("A frame still arriving is not silence")
    func aFrameOnItsWayIsNotSilence() async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        var receiver = TransferReceiver(directory: scratch.path, idleTimeout: .seconds(2))
        receiver.sendTimeout = .seconds(1)
        receiver.minimumDataRate = 16 << 10
        let content = pattern(1 << 20, seed: 8)
        let outcome = try await withDialedReceiver(.tls, receiver) { dial in
            let peer = try await dial.raw()
            let entries = [OfferEntry(kind: .file, path: ["slow"], size: UInt64(content.count), mode: 0o644, modificationTime: 0)]
            try await peer.write(MessageCodec.encodeFrame(.offer(Offer(algorithm: .xxh3_128, entries: entries))))
            guard case .accept? = try await peer.readMessage() else { return false }
            let data = MessageCodec.encodeFrame(.fileData(FileData(entry: 0, offset: 0, bytes: content)))
            for start in stride(from: 0, to: data.count, by: 64 << 10) {
                try await peer.write(Array(data[start..<min(start + (64 << 10), data.count)]))
                try await Task.sleep(for: .milliseconds(250))
            }
            let digest = DigestAlgorithm.xxh3_128.digest(of: content)
            try await peer.write(MessageCodec.encodeFrame(.fileDone(FileDone(entry: 0, size: UInt64(content.count), algorithm: .xxh3_128, digest: digest))))
            defer { peer.cancel() }
            guard case .verified? = try await peer.readMessage(), case .complete? = try await peer.readMessage() else { return false }
            return true
        }
        let ended = try #require(outcome.ended.first)
        if case .failure(let error) = ended { Issue.record("the receiver: \(error)") }
        #expect(try outcome.client.get(), "the sender was not answered Verified and Complete")
        #expect(readFile(scratch.sub("slow")) == content)
    }

    @Test("A Batch carries at most 4096 frames")
    func batchFrameLimit() throws {
        func batch(_ count: Int) -> [UInt8] {
            let inner = Array(repeating: Message.fileData(FileData(entry: 0, offset: 0, bytes: [1])), count: count)
            return Array(MessageCodec.encodeFrame(.batch(inner)).dropFirst(MessageCodec.headerSize))
        }
        guard case .batch(let taken) = try MessageCodec.decode(type: MessageType.batch.rawValue, body: batch(4096)) else {
            Issue.record("a Batch of 4096 frames is not a Batch")
            return
        }
        #expect(taken.count == 4096)
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: MessageType.batch.rawValue, body: batch(4097)) }
    }

    /// Issue 66 item 8, scaled down: two senders whose Batches hold 798 915 one-byte FileData each
    /// (16 MiB). Each is refused at its first Batch, before it is handled, and a legitimate
    /// sender that starts beside them is served.
    @Test("Batches of tiny FileData do not starve a legitimate sender")
    func tinyFileDataFlood() async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        let source = scratch.sub("legit")
        let content = pattern(300_000, seed: 9)
        try Data(content).write(to: URL(fileURLWithPath: source))
        let receiver = TransferReceiver(directory: dst, idleTimeout: .seconds(5))
        let count = 798_915
        // One-byte FileData frames, 21 bytes each, written out directly (encoding 800 000
        // messages takes seconds in a debug build).
        var body: [UInt8] = []
        body.reserveCapacity(21 * count)
        for offset in 0..<UInt64(count) {
            body += frame(type: MessageType.fileData.rawValue, body: [0, 0, 0, 0] + withUnsafeBytes(of: offset.bigEndian, Array.init) + [1])
        }
        let flood = body
        let clock = ContinuousClock()
        let outcome = try await withDialedReceiver(.tls, receiver, expectedEnds: 3) { dial in
            try await withThrowingTaskGroup(of: Void.self) { attackers in
                for index in 0..<2 {
                    let identity = try HostIdentity.ephemeral(commonName: "flood \(index)")
                    attackers.addTask {
                        let peer = dial.framed(as: identity)
                        let entries = [OfferEntry(kind: .file, path: ["flood\(index)"], size: UInt64(2 * count), mode: 0o644, modificationTime: 0)]
                        try await peer.send(.offer(Offer(algorithm: .xxh3_128, entries: entries, flags: [.batches])))
                        guard case .accept? = try await peer.receiveMessage() else { return }
                        try? await peer.sendFrame(type: MessageType.batch.rawValue, body: flood)
                        _ = try? await peer.receiveMessage()
                    }
                }
                try await Task.sleep(for: .milliseconds(300))
                let started = clock.now
                let sent = try await dial.framed(as: newcomer).runSender(TransferSender(tree: try SourceTree.scan([source])))
                let took = clock.now - started
                try await attackers.waitForAll()
                return (sent, took)
            }
        }
        let (sent, took) = try outcome.client.get()
        #expect(sent.succeeded == 1 && sent.failures.isEmpty, "the legitimate sender: \(sent.failures)")
        #expect(readFile(dst + "/legit") == content)
        // Generous: a debug build on two shared cores.
        #expect(took < .seconds(20), "the legitimate send took \(took) beside the flood")
        for case .failure(let error as TransferError) in outcome.ended {
            #expect(error.code == .limitExceeded && error.message.contains("4096 frames"), "\(error.message)")
        }
    }
}

/// A sender identity of its own, so that it takes nothing over.
private let newcomer = try! HostIdentity.ephemeral(commonName: "newcomer")

/// An Offer of `files` files of `size` bytes, named `prefix0`, `prefix1`, ….
private func offer(files: Int, size: UInt64, prefix: String) -> Offer {
    Offer(algorithm: .xxh3_128, entries: (0..<files).map {
        OfferEntry(kind: .file, path: ["\(prefix)\($0)"], size: size, mode: 0o644, modificationTime: 0)
    })
}

/// Offers `files` files, then once accepted sends one byte of them every 200 ms until cut off
/// or `limit` has passed (`accepted` is told when the Accept came); returns how long it was held and the receiver's last word.
private func drip(
    _ peer: any TransferPeer, files: Int, size: UInt64, prefix: String, for limit: Duration, accepted: @Sendable () -> Void = {}
) async throws -> (Duration, Message?) {
    try await peer.send(.offer(offer(files: files, size: size, prefix: prefix)))
    guard case .accept? = try await peer.receiveMessage() else { return (.zero, nil) }
    accepted()
    let clock = ContinuousClock()
    let started = clock.now
    let data = try await peer.openDataStream()
    let answer = Locked<Message?>(nil)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask {
            // Byte n of the offer, in order: file n / size at offset n % size.
            var n: UInt64 = 0
            while clock.now - started < limit, n < UInt64(files) * size {
                let message = Message.fileData(FileData(entry: UInt32(n / size), offset: n % size, bytes: [7]))
                guard (try? await data.send(message)) != nil else { return }
                n += 1
                try await Task.sleep(for: .milliseconds(200))
            }
            try await Task.sleep(until: started + limit)
        }
        group.addTask {
            let message = try? await peer.receiveMessage()
            answer.withLock { $0 = message ?? nil }
        }
        _ = try await group.next()
        group.cancelAll()
    }
    return (clock.now - started, answer.withLock { $0 })
}

/// The sender's clock on its own: a transfer of unknown size (standard input) is paced by its
/// source, so the rate alone never cuts it off, while it still counts as behind when another
/// sender needs room; a transfer of known size is cut off. The clock's verdict at any instant
/// past the allowance is the same, however late a loaded machine runs its task: the silence
/// limit is far (an hour), so only the rate can end the known-size wait.
@Suite("The sender's clock")
struct SenderClockTests {
    static func clock(expected: UInt64?) -> SenderClock {
        SenderClock(
            idle: .seconds(3600), pace: PeerPace(allowance: .milliseconds(50), bytesPerSecond: 1 << 20),
            framePace: PeerPace(allowance: .zero, bytesPerSecond: 1 << 20), expected: expected, hashingAllowance: .zero)
    }

    @Test("A known size behind the rate is cut off; an unknown size is not, but counts as behind")
    func unknownSizeIsPacedByItsSource() async throws {
        let known = Self.clock(expected: 1 << 30)
        let expiry = await known.waitForExpiry(transportBytes: { nil })
        guard case .tooSlow(bytes: 0, _)? = expiry else {
            Issue.record("a known-size transfer behind the rate was not cut off: \(String(describing: expiry))")
            return
        }
        let unknown = Self.clock(expected: nil)
        let watch = Task { await unknown.waitForExpiry(transportBytes: { nil }) }
        try await Task.sleep(for: .milliseconds(300))  // well past the 50 ms allowance
        #expect((unknown.shortfall(grace: .zero) ?? 0) > 0, "a transfer of unknown size behind the rate is not offered up to make room")
        watch.cancel()
        let unknownExpiry = await watch.value
        #expect(unknownExpiry == nil, "a transfer of unknown size was cut off by the rate: \(String(describing: unknownExpiry))")
    }
}
