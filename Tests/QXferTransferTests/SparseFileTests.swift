import Foundation
import LinuxSystem
import QXfer
@testable import QXferTransfer
import Testing

/// Sparse files (docs/PROTOCOL.md §3.8): their holes travel as Zeros messages and stay holes on
/// the receiver; a hostile Zeros gets the refusals a FileData would.
@Suite("Sparse files: holes as Zeros")
struct SparseFileTests {
    /// A file of `size` bytes with `runs` of data (offset, length) and holes elsewhere; returns
    /// its content.
    static func makeSparseFile(_ path: String, size: Int, runs: [(Int, Int)]) throws -> [UInt8] {
        var content = [UInt8](repeating: 0, count: size)
        let fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0o644)
        guard fd >= 0 else { throw TransferError(.io, "cannot create \(path)") }
        defer { close(fd) }
        #expect(ftruncate(fd, off_t(size)) == 0)
        for (index, (offset, length)) in runs.enumerated() {
            let data = pattern(length, seed: index + 1)
            content.replaceSubrange(offset..<offset + length, with: data)
            #expect(data.withUnsafeBytes { pwrite(fd, $0.baseAddress, length, off_t(offset)) } == length)
        }
        return content
    }

    static func allocatedBytes(_ path: String) -> Int {
        var info = stat()
        return stat(path, &info) == 0 ? Int(info.st_blocks) * 512 : -1
    }

    @Test("A sparse file's holes travel as Zeros and stay holes; the bytes that travel are its data", arguments: StackKind.allCases)
    func holesTravelAsZeros(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("src"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        let size = 64 << 20
        // Data at the start, in the middle (not block-aligned) and at the very end.
        let content = try Self.makeSparseFile(scratch.sub("src/disk.img"), size: size, runs: [(0, 100_000), (30_000_123, 5_000), (size - 4_096, 4_096)])
        let dense = pattern(3 << 20, seed: 7)
        try Data(dense).write(to: URL(fileURLWithPath: scratch.sub("src/dense.bin")))
        let tree = try SourceTree.scan([scratch.sub("src")])
        #expect(tree.mayHaveHoles)
        #expect(tree.entriesWithHoles.map { tree.entries[$0].path.last } == ["disk.img"])
        // What the sender announces once accepted, and its progress total then.
        let accepted = Locked<(bytes: UInt64, holes: UInt64)?>(nil)
        let progress = TransferProgress { event in
            if case .accepted(let bytes, _, _, _, let holes) = event { accepted.withLock { $0 = (bytes, holes) } }
        }
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree, progress: progress))
        })
        let sent = try client.get(), received = try server.get()
        #expect(sent.isComplete && received.isComplete)
        let identical = readFile(scratch.sub("dst/src/disk.img")) == content
        #expect(identical)
        #expect(readFile(scratch.sub("dst/src/dense.bin")) == dense)
        // What the file system reports as data (in blocks) travels; the rest is holes.
        let data = UInt64(100_000 + 5_000 + 4_096 + dense.count)
        #expect(sent.transferredBytes >= data && sent.transferredBytes <= data + (64 << 10), "\(sent.transferredBytes) bytes sent")
        #expect(sent.zeroBytes + sent.transferredBytes == UInt64(size + dense.count))
        #expect(received.zeroBytes == sent.zeroBytes && received.transferredBytes == sent.transferredBytes)
        #expect(Self.allocatedBytes(scratch.sub("dst/src/disk.img")) <= 512 << 10)
        // Announced from the start: the bytes that travelled, the holes apart; the total never
        // had to shrink.
        let announced = try #require(accepted.withLock { $0 })
        #expect(announced.bytes == sent.transferredBytes && announced.holes == sent.zeroBytes, "\(announced)")
        #expect(progress.totalBytes == sent.transferredBytes)
    }

    @Test("Short holes travel as data in full chunks, long ones as Zeros; both stay holes", arguments: StackKind.allCases)
    func shortHolesTravelAsData(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        // 4 MiB of 4 KiB of data and 4 KiB of hole in turn, an 8 MiB hole, 4 KiB of data.
        let runs = stride(from: 0, to: 4 << 20, by: 8192).map { ($0, 4096) } + [(12 << 20, 4096)]
        let content = try Self.makeSparseFile(scratch.sub("fragmented.img"), size: (12 << 20) + 4096, runs: runs)
        let tree = try SourceTree.scan([scratch.sub("fragmented.img")])
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let sent = try client.get()
        #expect(try server.get().isComplete)
        let identical = readFile(scratch.sub("dst/fragmented.img")) == content
        #expect(identical)
        // The short holes went as data (4 MiB, less the last one, which ends the span), the
        // long one as Zeros.
        #expect(sent.transferredBytes >= 4 << 20 - 4096 && sent.transferredBytes <= (4 << 20) + 4096, "\(sent.transferredBytes) bytes sent")
        #expect(sent.zeroBytes == UInt64(content.count) - sent.transferredBytes)
        #expect(Self.allocatedBytes(scratch.sub("dst/fragmented.img")) <= (2 << 20) + (256 << 10), "its zeros were written")
    }

    @Test("A sparse file that shrinks after the offer is reported as such, its lost end not sent as a hole", arguments: StackKind.allCases)
    func shrinkingSparseFile(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        let size = 8 << 20
        _ = try Self.makeSparseFile(scratch.sub("disk.img"), size: size, runs: [(0, 100_000), (6 << 20, 4096)])
        let tree = try SourceTree.scan([scratch.sub("disk.img")])
        #expect(tree.mayHaveHoles)
        #expect(truncate(scratch.sub("disk.img"), 3 << 20) == 0)  // its end, data and hole, gone
        let (sending, receiving) = (TransferProgress(), TransferProgress())
        let (_, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst"), progress: receiving))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree, progress: sending))
        })
        // It fails alone (docs/PROTOCOL.md §3.5, the sender's Failed).
        let sent = try client.get().failures.first?.error
        #expect(sent?.message.contains("'disk.img' shrank while it was being sent (it ended after \(3 << 20) of the \(size) bytes offered)") == true, "\(String(describing: sent))")
        #expect(!FileManager.default.fileExists(atPath: scratch.sub("dst/disk.img")))
        // The file's data and holes that never travelled left the progress totals.
        #expect(sending.totalBytes == sending.transferredBytes, "\(sending.totalBytes) \(sending.transferredBytes)")
        #expect(receiving.totalBytes == receiving.transferredBytes, "\(receiving.totalBytes) \(receiving.transferredBytes)")
    }

    @Test("Files without holes are offered without the zeros flag, so an older receiver still takes them")
    func denseFilesKeepTheOldOffer() throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try Data(pattern(2 << 20)).write(to: URL(fileURLWithPath: scratch.sub("dense.bin")))
        // A small file full of holes travels in a Batch, where Zeros are not used.
        _ = try Self.makeSparseFile(scratch.sub("small.img"), size: Int(ProtocolLimits.maximumEarlyFileSize), runs: [])
        #expect(!(try SourceTree.scan([scratch.sub("dense.bin"), scratch.sub("small.img")])).mayHaveHoles)
        _ = try Self.makeSparseFile(scratch.sub("large.img"), size: 8 << 20, runs: [(4096, 4096)])
        #expect(try SourceTree.scan([scratch.sub("dense.bin"), scratch.sub("large.img")]).mayHaveHoles)
    }

    @Test("An offer that may send Zeros is not declined for sizes beyond the free space; one without the flag is")
    func freeSpaceAndHoles() throws {
        let (scratch, dst) = try HostileNumbersTests.emptyFolder()
        defer { scratch.cleanup() }
        let store = FileStore(directory: try TargetDirectory(path: dst))
        // 8 TiB: beyond any test machine's free space, within what ext4 holds in one file.
        let image = [HostileNumbersTests.file(["image.raw"], size: 1 << 43)]
        let planner = OfferPlanner(maximumEntries: 10, overwrite: false)
        let dense = Offer(algorithm: .xxh3_128, entries: image, flags: [.batches, .early])
        #expect(throws: TransferError(.noSpace, "")) { try planner.plan(dense, paths: try planner.check(dense), store: store) }
        let sparse = Offer(algorithm: .xxh3_128, entries: image, flags: [.batches, .early, .zeros])
        let plans = try planner.plan(sparse, paths: try planner.check(sparse), store: store)
        guard case .receive? = plans.first else {
            Issue.record("planned \(plans)")
            return
        }
    }

    /// Holes counted at acceptance never were in the total; holes found beyond them (a file that
    /// changed, a resume that started over) leave it as they go.
    @Test("The progress total: holes counted at acceptance, and holes found later")
    func progressTotalWithHoles() {
        let progress = TransferProgress()
        progress.report(.accepted(bytes: 1000, resumed: 0, present: 0, skipped: 0, holes: 5000))
        progress.add(zeros: 3000)
        #expect(progress.totalBytes == 1000 && progress.zeroBytes == 3000)
        progress.add(zeros: 2500)  // 500 more than counted
        #expect(progress.totalBytes == 500 && progress.zeroBytes == 5500)
        progress.add(zeros: 100)
        #expect(progress.totalBytes == 400)
    }

    @Test("The runs of data between holes, as the file system reports them")
    func dataRuns() throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let mebibyte = 1 << 20
        _ = try Self.makeSparseFile(scratch.sub("f"), size: 4 * mebibyte, runs: [(0, 4096), (mebibyte, 8192)])
        let file = Descriptor(open(scratch.sub("f"), O_RDONLY))
        #expect(file.fd >= 0)
        let size = UInt64(4 * mebibyte)
        #expect(FileHoles.dataRun(in: file, from: 0, size: size) == 0..<4096)
        #expect(FileHoles.dataRun(in: file, from: 100, size: size) == 100..<4096)
        #expect(FileHoles.dataRun(in: file, from: 4096, size: size) == UInt64(mebibyte)..<UInt64(mebibyte + 8192))
        #expect(FileHoles.dataRun(in: file, from: UInt64(mebibyte + 8192), size: size) == size..<size)
        // Spans: short holes inside, up to a long one, at least `length` when the runs allow.
        _ = try Self.makeSparseFile(scratch.sub("g"), size: 6 * mebibyte, runs: [(0, 4096), (8192, 4096), (3 * mebibyte, 4096)])
        let g = Descriptor(open(scratch.sub("g"), O_RDONLY))
        let gSize = UInt64(6 * mebibyte), third = UInt64(3 * mebibyte)
        #expect(FileHoles.dataSpan(in: g, from: 0, size: gSize, length: 1 << 20) == 0..<12288)
        #expect(FileHoles.dataSpan(in: g, from: 0, size: gSize, length: 4096) == 0..<4096)
        #expect(FileHoles.dataSpan(in: g, from: 12288, size: gSize, length: 1 << 20) == third..<third + 4096)
        #expect(FileHoles.dataSpan(in: g, from: third + 4096, size: gSize, length: 1 << 20) == gSize..<gSize)
        // What goes as Zeros: the long holes only (the short one at 4096 travels as data).
        #expect(FileHoles.holeBytes(in: g, from: 0, size: gSize) == gSize - 3 * 4096 - 4096)
        #expect(FileHoles.holeBytes(in: g, from: 12288, size: gSize) == gSize - 12288 - 4096)
        #expect(FileHoles.holeBytes(in: g, from: third, size: gSize) == gSize - third - 4096)
        #expect(FileHoles.holeBytes(in: g, from: gSize, size: gSize) == 0)
        // A short hole at the end goes as data.
        #expect(FileHoles.dataSpan(in: g, from: third + 4096, size: third + 4196, length: 1 << 20) == third + 4096..<third + 4196)
        // The size offered bounds the runs (a file that grew since the scan).
        #expect(FileHoles.dataRun(in: file, from: 4096, size: UInt64(mebibyte + 10)) == UInt64(mebibyte)..<UInt64(mebibyte + 10))
        #expect(FileHoles.dataRun(in: file, from: size, size: size) == size..<size)
    }

    @Test("A Zeros without the offer's flag, past the file's size, or at a gap is refused, and nothing is written", arguments: StackKind.allCases)
    func hostileZeros(_ kind: StackKind) async throws {
        let attacks: [(String, Offer.Flags, [Message], TransferError.Code)] = [
            ("without the flag", [], [.zeros(Zeros(entry: 0, offset: 0, length: 10))], .malformed),
            ("past its size", [.zeros], [.zeros(Zeros(entry: 0, offset: 0, length: 1001))], .protocolViolation),
            ("at a gap", [.zeros], [.fileData(FileData(entry: 0, offset: 0, bytes: pattern(10))), .zeros(Zeros(entry: 0, offset: 20, length: 10))], .protocolViolation),
            ("in a Batch, past its size", [.zeros, .batches], [.batch([.zeros(Zeros(entry: 0, offset: 0, length: 999)), .zeros(Zeros(entry: 0, offset: 999, length: 2))])], .protocolViolation),
            ("of the largest length", [.zeros], [.zeros(Zeros(entry: 0, offset: 0, length: ProtocolLimits.maximumZerosLength))], .protocolViolation),
        ]
        for (name, flags, messages, code) in attacks {
            let (scratch, dst) = try HostileNumbersTests.emptyFolder()
            defer { scratch.cleanup() }
            try await HostileNumbersTests.expectRefused(kind, name, [HostileNumbersTests.file(["target"], size: 1000)], dst: dst, flags: flags, sending: messages, code: code)
            #expect(!FileManager.default.fileExists(atPath: dst + "/target"), "\(name)")
        }
    }
}
