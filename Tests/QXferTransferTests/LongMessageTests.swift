import FoundationEssentials
import Foundation
import Testing
@testable import QXferTransfer
@testable import LinuxSystem

/// Offers and Accepts longer than one frame travel in parts (docs/PROTOCOL.md §3.9). One test
/// at a time: each moves tens of megabytes, and beside the other suites on two cores they
/// starved tests that wait for a network answer.
@Suite(.serialized) struct LongMessageTests {
    /// `count` files, each under ``folders``: about 3.9 KB of offer apiece.
    static func deepOffer(count: Int) -> Offer {
        Offer(algorithm: .xxh3_128, entries: (0..<count).map {
            OfferEntry(kind: .file, path: folders + ["file-\($0)"], size: UInt64($0), mode: 0o644, modificationTime: Int64($0))
        }, flags: [.batches, .long])
    }

    static func frameBytes(_ frames: [(type: UInt32, body: [UInt8])]) -> [UInt8] {
        var w = ByteWriter()
        for frame in frames {
            w.u32(frame.type)
            w.u32(UInt32(frame.body.count))
            w.bytes(frame.body)
        }
        return w.buffer
    }

    @Test func anOfferLongerThanAFrameGoesInPartsAndComesBackWhole() throws {
        let offer = Self.deepOffer(count: 5000)
        let message = Message.offer(offer)
        let body = MessageCodec.encodeBody(message)
        #expect(body.count > ProtocolLimits.maximumMessageSize)
        #expect(MessageCodec.mayNeedParts(offer))

        let frames = MessageCodec.frames(of: message)
        #expect(frames.map(\.type) == [MessageCodec.continuationType, MessageType.offer.rawValue])
        #expect(frames.allSatisfy { $0.body.count <= ProtocolLimits.maximumMessageSize })
        #expect(frames[0].body.count == ProtocolLimits.maximumMessageSize)
        #expect(Array(frames[0].body.prefix(4)) == [0, 0, 0, 1])
        #expect(Array(frames[0].body.dropFirst(4)) + frames[1].body == body)

        var assembler = MessageAssembler()
        #expect(try assembler.take(type: frames[0].type, body: Data(frames[0].body)) == nil)
        #expect(assembler.isPartial)
        #expect(try assembler.take(type: frames[1].type, body: Data(frames[1].body)) == message)
        #expect(!assembler.isPartial)

        // A byte stream with a short message after it: both come out, in order.
        var decoder = FrameDecoder()
        decoder.append(Self.frameBytes(frames) + MessageCodec.encodeFrame(.verified(entry: 1)))
        #expect(try decoder.next() == message)
        #expect(try decoder.next() == .verified(entry: 1))
        #expect(try decoder.next() == nil)
    }

    @Test func shortMessagesStayOneFrame() {
        let offer = Self.deepOffer(count: 4000)  // 15.3 MB
        #expect(!MessageCodec.mayNeedParts(offer))
        #expect(MessageCodec.frames(of: .offer(offer)).map(\.type) == [MessageType.offer.rawValue])
        #expect(MessageCodec.frames(of: .verified(entry: 3)).map(\.type) == [MessageType.verified.rawValue])
    }

    @Test func theLongFlagIsSetWhenTheAcceptCouldNeedParts() {
        // 4 + count × (12 + 32) bytes with every answer carrying a SHA-256 digest, against 29
        // bytes of offer for each of these entries: the Accept decides. (With XXH3-128, 28
        // bytes an answer, the offer always needs parts first.)
        let most = (ProtocolLimits.maximumMessageSize - 4) / 44
        let entry = OfferEntry(kind: .file, path: ["f"], size: 1, mode: 0o644, modificationTime: 0)
        let fits = MessageCodec.mayNeedParts(Offer(algorithm: .sha256, entries: Array(repeating: entry, count: most)))
        let over = MessageCodec.mayNeedParts(Offer(algorithm: .sha256, entries: Array(repeating: entry, count: most + 1)))
        let xxh3 = MessageCodec.mayNeedParts(Offer(algorithm: .xxh3_128, entries: Array(repeating: entry, count: most + 1)))
        #expect(!fits && over && !xxh3)
    }

    @Test func anAcceptInPartsComesBackWhole() throws {
        let present = EntryAnswer(disposition: .present, prefixDigest: Array(repeating: 0x5a, count: 32))
        let accept = Message.accept(Accept(answers: Array(repeating: present, count: 400_000) + [.sendAll]))
        let frames = MessageCodec.frames(of: accept)
        #expect(frames.map(\.type) == [MessageCodec.continuationType, MessageType.accept.rawValue])
        #expect(MessageCodec.acceptBodySize(Array(repeating: present, count: 400_000) + [.sendAll]) == MessageCodec.encodeBody(accept).count)
        var decoder = FrameDecoder()
        decoder.append(Self.frameBytes(frames))
        #expect(try decoder.next() == accept)
    }

    @Test func anAcceptInPartsGoesOnlyToASenderThatTakesOne() throws {
        let present = EntryAnswer(disposition: .present, prefixDigest: Array(repeating: 1, count: 16))
        let answers = Array(repeating: present, count: 600_000)  // 16.8 MB
        let entries = [OfferEntry(kind: .file, path: ["f"], size: 1, mode: 0o644, modificationTime: 0)]
        #expect(throws: TransferError(.limitExceeded, "")) {
            try OfferPlanner.checkAnswersFit(answers, to: Offer(algorithm: .xxh3_128, entries: entries, flags: [.batches]))
        }
        try OfferPlanner.checkAnswersFit(answers, to: Offer(algorithm: .xxh3_128, entries: entries, flags: [.batches, .long]))
        try OfferPlanner.checkAnswersFit(answers.prefix(500_000), to: Offer(algorithm: .xxh3_128, entries: entries, flags: [.batches]))
    }

    /// On QUIC only: the sender reads the receiver's Error the same way on either stack.
    @Test("A long offer to an older receiver, which refuses its first part, says why")
    func aLongOfferToAnOlderReceiver() async throws {
        let kind = StackKind.quic
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let tree = try Self.deepTree(in: scratch)
        let (_, client) = try await withConnectedPair(kind, receive: { peer in
            // As a receiver before §3.9 does: type 12 is unknown, so malformed.
            do {
                _ = try await peer.receiveMessage()
            } catch let error as TransferError {
                try await peer.send(.error(Refusal(error)))
            }
            try await Task.sleep(for: .seconds(1))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(throws: TransferError(.unsupported, "")) { try client.get() }
        if case .failure(let error as TransferError) = client {
            #expect(error.message.contains("older qxfer") && error.message.contains("unknown message type 12"), "\(error.message)")
        }
    }

    @Test func partsOutOfTheRulesAreRefused() throws {
        let offerPart = Data([0, 0, 0, 1] + [1, 0, 0, 0])
        let malformed = TransferError(.malformed, "")
        // A Continuation of a type that never comes in parts, or with no bytes of the body.
        var a = MessageAssembler()
        #expect(throws: malformed) { try a.take(type: 12, body: Data([0, 0, 0, 4, 9, 9])) }
        var b = MessageAssembler()
        #expect(throws: malformed) { try b.take(type: 12, body: Data([0, 0, 0, 1])) }
        // Another frame, or a part of another type, among the parts of an Offer.
        var c = MessageAssembler()
        #expect(try c.take(type: 12, body: offerPart) == nil)
        #expect(throws: malformed) { try c.take(type: MessageType.verified.rawValue, body: Data([0, 0, 0, 1])) }
        var d = MessageAssembler()
        #expect(try d.take(type: 12, body: offerPart) == nil)
        #expect(throws: malformed) { try d.take(type: 12, body: Data([0, 0, 0, 2, 0])) }
        var e = MessageAssembler()
        #expect(try e.take(type: 12, body: offerPart) == nil)
        #expect(throws: malformed) { try e.take(type: MessageType.accept.rawValue, body: Data([0, 0, 0, 0])) }
        // Where no part may come, type 12 is unknown: alone, and inside a Batch.
        #expect(throws: malformed) { try MessageCodec.decode(type: 12, body: [0, 0, 0, 1, 1]) }
        let inner: [UInt8] = [0, 0, 0, 12, 0, 0, 0, 5, 0, 0, 0, 1, 1]
        #expect(throws: malformed) { try MessageCodec.decode(type: MessageType.batch.rawValue, body: inner) }
        // Parts that would put the whole body over the bound are refused as they come (the
        // protocol's 256 MiB, here 1 KiB), up to it they are taken.
        var f = MessageAssembler(limit: 1024)
        let part = Data([0, 0, 0, 1] + [UInt8](repeating: 0, count: 256))
        for _ in 0..<4 { #expect(try f.take(type: 12, body: part) == nil) }
        #expect(throws: TransferError(.limitExceeded, "")) { try f.take(type: 12, body: Data([0, 0, 0, 1, 0])) }
        var g = MessageAssembler(limit: 1024)
        for _ in 0..<4 { #expect(try g.take(type: 12, body: part) == nil) }
        #expect(throws: TransferError(.limitExceeded, "")) { try g.take(type: 1, body: Data([0])) }
    }

    /// The receiver's check of a long offer looks each path up component by component; what it
    /// refuses stays what it refused when it looked up every prefix as a whole path.
    @Test func thePlannersIndexRefusesWhatItDidAtAnyDepth() throws {
        func entry(_ kind: EntryKind, _ path: String) -> OfferEntry {
            OfferEntry(kind: kind, path: path.split(separator: "/").map(String.init), mode: 0o644, modificationTime: 0)
        }
        let planner = OfferPlanner(maximumEntries: ProtocolLimits.maximumEntries, overwrite: false)
        let refused: [([OfferEntry], String)] = [
            ([entry(.file, "a/b/c"), entry(.file, "a/b/c")], "'a/b/c' is offered twice"),
            ([entry(.directory, "d"), entry(.directory, "d")], "'d' is offered twice"),
            ([entry(.file, "f"), entry(.file, "f/x")], "'f/x' is offered inside 'f', which is not a directory"),
            ([entry(.directory, "d"), entry(.file, "d/f"), entry(.directory, "d/f/g/h")], "'d/f/g/h' is offered inside 'd/f', which is not a directory"),
            ([entry(.file, "x/y/z"), OfferEntry(kind: .symlink, path: ["x", "y"], mode: 0o777, modificationTime: 0, linkTarget: "z"),
              entry(.file, "x/y/w")], "'x/y/w' is offered inside 'x/y', which is not a directory"),
        ]
        for (entries, message) in refused {
            #expect(throws: TransferError(.unsafePath, message)) { try planner.check(Offer(algorithm: .xxh3_128, entries: entries)) }
            do {
                _ = try planner.check(Offer(algorithm: .xxh3_128, entries: entries))
            } catch {
                #expect(error.message == message)
            }
        }
        // Folders offered or not, one name in many folders, the same name at another depth.
        let fine = [entry(.directory, "d"), entry(.file, "d/a"), entry(.file, "e/a"), entry(.file, "e/e/a"), entry(.file, "a"), entry(.file, "d/d/d/a")]
        #expect(try planner.check(Offer(algorithm: .xxh3_128, entries: fine)).map(\.description) == ["d", "d/a", "e/a", "e/e/a", "a", "d/d/d/a"])
        // 20 000 files 64 folders deep pass.
        let folders = (0..<63).map { "f\($0)" }
        let deep = (0..<20_000).map { OfferEntry(kind: .file, path: folders + ["\($0)"], mode: 0o644, modificationTime: 0) }
        #expect(try planner.check(Offer(algorithm: .xxh3_128, entries: deep)).count == 20_000)
    }

    @Test("An offer longer than a frame crosses both stacks", arguments: StackKind.allCases)
    func aLongOfferCrossesBothStacks(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let tree = try Self.deepTree(in: scratch)
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)

        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(try client.get().isComplete && server.get().isComplete)
        let arrived = try FileManager.default.contentsOfDirectory(atPath: scratch.sub("dst/" + (["top"] + Self.folders).joined(separator: "/")))
        #expect(arrived.count == 4600)
    }

    @Test("A receiver's offers share a memory budget: one too large for it alone, and one that does not fit beside another's, are declined once their parts are in, saying which", arguments: StackKind.allCases)
    func offersBeyondTheMemoryBudgetAreDeclined(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let tree = try Self.deepTree(in: scratch)  // 17.6 MB of offer: 282 MB reserved
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        func offer(to memory: OfferMemory) async throws -> (server: Result<TransferSummary, any Error>, client: Result<TransferSummary, any Error>) {
            var receiver = TransferReceiver(directory: scratch.sub("dst"))
            receiver.offerMemory = memory
            let configured = receiver
            return try await withConnectedPair(kind, receive: { peer in try await peer.runReceiver(configured) }, send: { peer in
                try await peer.runSender(TransferSender(tree: tree))
            })
        }

        // Larger than every offer may be together.
        let small = OfferMemory(limit: 64 << 20)
        let alone = try await offer(to: small)
        #expect(throws: TransferError.self) { try alone.server.get() }
        let refused = #expect(throws: TransferError.self) { try alone.client.get() }
        #expect(refused?.code == .limitExceeded)
        #expect(refused?.message.contains("the receiver declined: an offer this large needs more memory than this receiver lets offers take (67.1 MB); send fewer files at once") == true, "\(String(describing: refused))")
        #expect(small.heldBytes == 0)

        // Beside another connection's offer that holds most of the budget.
        let shared = OfferMemory(limit: 400 << 20)
        let other = shared.reservation()
        try other.add(offerBytes: (200 << 20) / OfferMemory.bytesHeldPerOfferByte)
        let beside = try await offer(to: shared)
        let busy = #expect(throws: TransferError.self) { try beside.client.get() }
        #expect(busy?.code == .busy)
        #expect(busy?.message.contains("other large offers hold the memory this receiver lets offers take; send again once they are done") == true, "\(String(describing: busy))")
        #expect(shared.heldBytes == 200 << 20)
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.sub("dst")).isEmpty)

        // Once that one is done, the same offer goes through, and gives its share back at the end.
        other.release()
        let after = try await offer(to: shared)
        #expect(try after.client.get().isComplete && after.server.get().isComplete)
        #expect(shared.heldBytes == 0)
    }

    @Test func theBudgetCountsEveryReservation() throws {
        let memory = OfferMemory(limit: 1600)
        let first = memory.reservation(), second = memory.reservation()
        try first.add(offerBytes: 50)  // 800
        try second.add(offerBytes: 40)  // 640
        #expect(memory.heldBytes == 1440)
        #expect(throws: TransferError(.busy, "")) { try second.add(offerBytes: 20) }
        #expect(throws: TransferError(.limitExceeded, "")) { try memory.reservation().add(offerBytes: 101) }
        #expect(throws: TransferError(.limitExceeded, "")) { try memory.reservation().add(offerBytes: Int.max / 2) }
        first.release()
        try second.add(offerBytes: 20)
        #expect(memory.heldBytes == 960)
        do { let third = memory.reservation(); try third.add(offerBytes: 10) }  // released when it goes
        #expect(memory.heldBytes == 960)
        second.release()
        second.release()
        #expect(memory.heldBytes == 0)
    }

    @Test("The allowances follow a control group's memory limit, the lowest on the way from the root (v2 and v1)")
    func controlGroupLimits() {
        let files: [String: String] = [
            "/sys/fs/cgroup/memory.max": "max\n",  // none at the v2 root
            "/sys/fs/cgroup/user.slice/memory.max": "8589934592\n",
            "/sys/fs/cgroup/user.slice/app.service/memory.max": "max\n",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",  // v1's "none"
            "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "536870912\n",
        ]
        let read: (String) -> String? = { files[$0] }
        #expect(UsableMemory.controlGroupLimit(membership: "0::/user.slice/app.service\n", read: read) == 8 << 30)
        #expect(UsableMemory.controlGroupLimit(membership: "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n", read: read) == 512 << 20)
        #expect(UsableMemory.controlGroupLimit(membership: "4:cpu,memory:/docker/abc\n", read: read) == 512 << 20)
        #expect(UsableMemory.controlGroupLimit(membership: "0::/\n", read: read) == nil)
        #expect(UsableMemory.controlGroupLimit(membership: "garbage\n0::/../../x\n", read: read) == nil)
        #expect(UsableMemory.bytes > 0)
        #expect(UsableMemory.share(1, of: 4, atLeast: 256 << 20, atMost: 4 << 30) == min(max(UsableMemory.bytes / 4, 256 << 20), 4 << 30))
    }

    /// 15 folders of 250-byte names: 3.8 KB of offer for each file under them, and few enough
    /// components that the receiver's work per entry (a lookup per component) stays small.
    static let folders = (0..<15).map { String(repeating: Character(UnicodeScalar(UInt8(97 + $0))), count: 250) }

    /// 4 600 empty files under `top` and ``folders``: an offer of about 17.6 MB.
    static func deepTree(in scratch: TempDir) throws -> SourceTree {
        let deep = scratch.sub((["top"] + folders).joined(separator: "/"))
        try FileManager.default.createDirectory(atPath: deep, withIntermediateDirectories: true)
        for index in 0..<4600 { _ = FileManager.default.createFile(atPath: "\(deep)/file-\(index)", contents: nil) }
        let tree = try SourceTree.scan([scratch.sub("top")])
        #expect(MessageCodec.encodeBody(.offer(Offer(algorithm: .xxh3_128, entries: tree.entries))).count > ProtocolLimits.maximumMessageSize)
        return tree
    }
}
