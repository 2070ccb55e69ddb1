// libFuzzer target: what each side of qxfer/1 computes from decoded messages, past the codec —
// the receiver's offer checks and plan (Receiver/OfferPlanner.swift), its ReceivingSession fed
// FileData, Zeros, FileDone, the sender's Failed (alone or in Batches, with the offer's batches
// and zeros flags or without), stream ends, failures and its committer's outcomes, and its Complete; the sender's SenderLedger fed
// hostile Accept, Verified, Failed and Complete. The input is not wire bytes but a script: each
// byte picks the next step and its values, and numbers come from a table of extremes (0, 1,
// 2^32, 2^63, 2^64 - 1, …) or from the state (the next expected offset, the right digest), so
// the fuzzer reaches deep states with values that overflow naive arithmetic. The receiver
// writes real files through its FileStore into one folder under /dev/shm, emptied after
// every input.
//
// Oracles, beyond "never traps": every error is a TransferError (or the session's cancelled
// one) with a one-line message; every Verified/Failed names an offered entry, files only for
// Verified; a Complete counts every entry of the offer exactly once (succeeded + failed =
// count); nothing but final names and hidden partials/journals is left in the folder; the
// sender's ledger accepts a Complete only when every file had its verdict. An input whose first
// byte is 0xF0 or more is a Continuation-only stream fed to the MessageAssembler instead.
#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials

/// Reads the script: one byte at a time, 0 once exhausted.
struct Script {
    private let bytes: [UInt8]
    private var index = 0
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    var isEmpty: Bool { index >= bytes.count }
    mutating func byte() -> UInt8 {
        defer { index += 1 }
        return index < bytes.count ? bytes[index] : 0
    }
    mutating func pick<T>(_ values: [T]) -> T { values[Int(byte()) % values.count] }

    static let extremes: [UInt64] = [
        0, 1, 2, 15, 16, 17, 255, 1 << 20, (1 << 20) + 1, 1 << 32, (1 << 32) - 1, 1 << 62,
        1 << 63, (1 << 63) + 1, .max - 1, .max,
    ]
    /// A small number (0…127) or an extreme one.
    mutating func number() -> UInt64 {
        let b = byte()
        return b < 128 ? UInt64(b) : Script.extremes[Int(b) % Script.extremes.count]
    }
    /// As ``number()``, within UInt32 (the extremes past it become UInt32.max).
    mutating func number32() -> UInt32 { UInt32(clamping: number()) }
}

let names = ["a", "b", "d", "f", "..", "x.qxfer-partial", "", "l"]
let linkTargets = ["a", "d/f", "../a", "..", "/etc", "a/../../x"]

func makeEntries(_ script: inout Script) -> [OfferEntry] {
    let count = Int(script.byte() % 7)
    var entries: [OfferEntry] = []
    for _ in 0..<count {
        let kind = EntryKind(rawValue: script.byte() % 3)!
        var path = [script.pick(names)]
        // Under an earlier entry (offered as a folder or not), or under a name never offered.
        switch script.byte() % 4 {
        case 1 where !entries.isEmpty: path = entries[Int(script.byte()) % entries.count].path + path
        case 2: path = ["missing"] + path
        default: break
        }
        let unknown = kind == .file && script.byte() % 5 == 0
        let size = kind == .file && !unknown ? script.number() : 0
        let mtime = Int64(bitPattern: script.number())
        let target = kind == .symlink ? script.pick(linkTargets) : ""
        // Sent before Accept (docs/PROTOCOL.md §3.7); the codec refuses a mark that does not fit.
        var flags: OfferEntry.Flags = unknown ? .sizeUnknown : []
        if script.byte() % 3 == 0 { flags.insert(.early) }
        entries.append(OfferEntry(kind: kind, flags: flags, path: path, size: size, mode: 0o644, modificationTime: mtime, linkTarget: target))
    }
    return entries
}

/// One folder for every input, created once and emptied after each.
let root: String = {
    var template = Array("/dev/shm/qxfer-fuzz-session-XXXXXX".utf8CString)
    guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else { fatalError("mkdtemp") }
    return String(cString: made)
}()

/// The folder itself goes when the fuzzer exits (it empties it after every input).
let removeRootAtExit: Void = { atexit { _ = rmdir(root) } }()

/// Removes everything inside `directory` (not following symlinks).
func empty(_ directory: Int32) {
    guard let dir = fdopendir(dup(directory)) else { return }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
        if name != "." && name != ".." { names.append(name) }
    }
    for name in names where unlinkat(directory, name, 0) != 0 {
        let sub = openat(directory, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        if sub >= 0 {
            empty(sub)
            close(sub)
        }
        unlinkat(directory, name, AT_REMOVEDIR)
    }
}

func check(_ error: any Error, _ context: String) {
    if let error = error as? TransferError {
        precondition(!error.message.contains("\n"), "\(context): a multi-line message: \(error.message)")
    } else {
        preconditionFailure("\(context): not a TransferError: \(error)")
    }
}

/// Content of entry `entry` at `offset`: what the harness "sends" (so it knows the digest).
func content(_ entry: UInt32, _ offset: UInt64) -> UInt8 { UInt8(truncatingIfNeeded: UInt64(entry) &* 31 &+ offset) }

func fuzzReceiver(_ script: inout Script) {
    let algorithm: DigestAlgorithm = script.byte() & 1 == 0 ? .xxh3_128 : .sha256
    let overwrite = script.byte() & 1 == 1
    let usesStreams = script.byte() & 1 == 1
    let batches = script.byte() & 1 == 1
    let zeros: Offer.Flags = script.byte() & 1 == 1 ? .zeros : []
    // The offer travels through the codec, as on the wire: only what decodes reaches the planner.
    let flags: Offer.Flags = batches ? [.batches, .early] : []
    let sent = Offer(algorithm: algorithm, entries: makeEntries(&script), flags: flags.union(zeros))
    guard case .offer(let offer) = try? MessageCodec.decode(type: MessageType.offer.rawValue, body: MessageCodec.encodeBody(.offer(sent))) else { return }
    let directory: TargetDirectory
    do { directory = try TargetDirectory(path: root) } catch { preconditionFailure("\(error)") }
    _ = removeRootAtExit
    defer { empty(directory.root.fd) }
    // Something already at a name: a file, a folder, a symlink, or an earlier attempt's partial.
    let store = FileStore(directory: directory, overwrite: overwrite, checkpointInterval: 16)
    // What the harness has "sent" of each entry, to offer the right digest and the next offset.
    var sentBytes: [UInt32: [UInt8]] = [:]
    switch script.byte() % 6 {
    case 1: close(openat(directory.root.fd, script.pick(names), O_CREAT | O_WRONLY, 0o644))
    case 2: mkdirat(directory.root.fd, script.pick(names), 0o755)
    case 3: symlinkat(script.pick(linkTargets), directory.root.fd, script.pick(names))
    case 4, 5:
        if let entry = offer.entries.first, entry.kind == .file, let path = try? SafePath(validating: entry.path), entry.size > 0 {
            let target = FileTarget(path: path, size: entry.size, mode: 0o644, modificationTime: entry.modificationTime, algorithm: algorithm)
            if let writer = try? store.openWriter(for: target) {
                let held = min(entry.size, UInt64(script.byte()))
                if held > 0 { try? writer.write((0..<held).map { content(0, $0) }, at: 0) }
                writer.abandon()
                sentBytes[0] = (0..<held).map { content(0, $0) }
            }
        }
    default: break
    }

    let planner = OfferPlanner(maximumEntries: 5, overwrite: overwrite)
    let paths: [SafePath]
    var plans: [Plan]
    do {
        paths = try planner.check(offer)
        precondition(OfferPlanner.totalSize(of: offer.entries) != nil, "an offer whose sizes overflow passed the checks")
        plans = try planner.plan(offer, paths: paths, store: store)
    } catch {
        check(error, "planning")
        return
    }
    for (index, plan) in plans.enumerated() {
        guard case .directory = plan else { continue }
        do { try directory.createDirectory(paths[index]) } catch { plans[index] = .skip(error) }
    }
    var session = ReceivingSession(offer: offer, paths: paths, store: store, progress: TransferProgress())
    session.expect(plans)
    _ = session.hashingAllowance

    let count = UInt32(offer.entries.count)
    func entry(_ script: inout Script) -> UInt32 {
        let b = script.byte()
        return b < 192 || count == 0 ? (count == 0 ? 0 : UInt32(b) % count) : script.pick([count, count + 1, UInt32.max])
    }
    func source(_ script: inout Script) -> InboundFunnel.Source {
        let b = script.byte() % 4
        return b == 0 ? .control : .data(Int(b))
    }
    func verify(_ replies: [Message]) {
        for reply in replies {
            switch reply {
            case .verified(let e):
                precondition(e < count && offer.entries[Int(e)].kind == .file, "Verified for entry \(e)")
            case .failed(let failure):
                precondition(failure.entry < count, "Failed for entry \(failure.entry)")
            default: preconditionFailure("the session replied \(reply)")
            }
        }
    }
    while !session.isFinished && !script.isEmpty {
        var event: InboundFunnel.Event
        switch script.byte() % 8 {
        case 0, 1, 2:
            let e = entry(&script)
            let have = UInt64(sentBytes[e]?.count ?? 0)
            let offset = script.byte() < 200 ? have : script.number()
            let length = 1 + Int(script.byte() % 48)
            if script.byte() % 4 == 0 {
                // Zeros, of a length the codec lets through (1 … 1 GiB); what was "sent" keeps
                // them when they are few enough to hold.
                let count = script.byte() < 200 ? UInt64(length) * 1000 : script.pick([1, 4096, 1 << 20, ProtocolLimits.maximumZerosLength])
                let kept = count <= 1 << 20 ? [UInt8](repeating: 0, count: Int(count)) : []
                if offset == have { sentBytes[e, default: []] += kept }
                if offset == 0 && have > 0 { sentBytes[e] = kept }
                event = .message(.zeros(Zeros(entry: e, offset: offset, length: count)))
            } else {
                let bytes = (0..<UInt64(length)).map { content(e, offset &+ $0) }
                if offset == have { sentBytes[e, default: []] += bytes }
                if offset == 0 && have > 0 { sentBytes[e] = bytes }  // a restart from 0
                event = .message(.fileData(FileData(entry: e, offset: offset, bytes: bytes)))
            }
        case 3, 4:
            let e = entry(&script)
            if script.byte() % 5 == 0 {
                // The sender gives the file up where its FileDone would go (docs/PROTOCOL.md §3.5).
                event = .message(.failed(EntryFailure(entry: e, code: script.pick([.io, .internal, TransferError.Code(rawValue: 999)]), message: "cannot read")))
                break
            }
            let bytes = sentBytes[e] ?? []
            let size = script.byte() < 200 ? UInt64(bytes.count) : script.number()
            let right = script.byte() < 200
            let digest = right ? algorithm.digest(of: bytes) : [UInt8](repeating: 7, count: algorithm.digestLength)
            let other: DigestAlgorithm = algorithm == .sha256 ? .xxh3_128 : .sha256
            event = .message(.fileDone(FileDone(entry: e, size: size, algorithm: script.byte() < 240 ? algorithm : other, digest: digest)))
        case 5:
            event = .ended
        case 6:
            event = .failed(script.byte() & 1 == 0 ? TransferError(.cancelled, "taken over") : CancellationError())
        default:
            event = .message(script.pick([
                .verified(entry: entry(&script)), .complete(Complete(succeeded: 1, failed: 0)),
                .error(Refusal(code: .io, message: "gone")), .offer(offer),
            ]))
        }
        // Batched (with or without the flag), sometimes with a message that may not be inside.
        if case .message(let message) = event, script.byte() % 4 == 0 {
            event = .message(.batch(script.byte() % 3 == 0 ? [message, .verified(entry: 0)] : [message]))
        }
        do {
            let from = source(&script)
            verify(try session.handle(event, from: from, usesStreams: usesStreams))
            // The committer, run here in line: its outcomes come back as an event.
            while let files = session.takeCommitGroup() {
                verify(try session.handle(.committed(FileCommitter.commit(files)), from: .committer, usesStreams: usesStreams))
            }
        } catch is CancellationError {
            session.abandonOpenFiles()
            return
        } catch let relayed as AlreadyCommunicated {
            check(relayed.error, "the sender's Error")
            session.abandonOpenFiles()
            return
        } catch {
            check(error, "session")
            session.abandonOpenFiles()
            return
        }
    }
    guard session.isFinished else {
        session.abandonOpenFiles()
        return
    }
    do {
        let replies = try session.finishTree()
        verify(Array(replies.dropLast()))
        guard case .complete(let complete)? = replies.last else { preconditionFailure("no Complete at the end") }
        precondition(UInt64(complete.succeeded) + UInt64(complete.failed) == UInt64(count),
                     "Complete(\(complete.succeeded), \(complete.failed)) for \(count) entries")
    } catch {
        check(error, "finishing")
    }
}

func fuzzSender(_ script: inout Script) {
    let algorithm: DigestAlgorithm = script.byte() & 1 == 0 ? .xxh3_128 : .sha256
    let entries = makeEntries(&script)
    // The receiver's answers, through the codec as on the wire.
    var answers: [EntryAnswer] = []
    let answerCount = max(0, entries.count + Int(script.byte() % 3) - 1)
    for _ in 0..<answerCount {
        let disposition = EntryAnswer.Disposition(rawValue: script.byte() % 3)!
        let code = disposition == .skip ? UInt16(1 + script.byte() % 14) : 0
        let offset = disposition == .send ? script.number() : 0
        let digestLength = disposition == .skip || (disposition == .send && offset == 0) ? 0 : Int(script.pick([16, 32, 64, 1] as [UInt8]))
        answers.append(EntryAnswer(disposition: disposition, code: code, offset: offset, prefixDigest: [UInt8](repeating: 1, count: digestLength)))
    }
    guard case .accept(let accept) = try? MessageCodec.decode(type: MessageType.accept.rawValue, body: MessageCodec.encodeBody(.accept(Accept(answers: answers)))) else { return }
    var ledger: SenderLedger
    do {
        ledger = try SenderLedger(entries: entries, algorithm: algorithm, answers: accept.answers)
    } catch {
        check(error, "accept")
        precondition(error.code == .protocolViolation, "Accept refused with \(error.code)")
        return
    }
    precondition(ledger.jobs.allSatisfy { entries[Int($0.index)].kind == .file }, "a job for a folder or symlink")
    let count = UInt32(entries.count)
    while !script.isEmpty {
        let b = script.byte()
        let entry = b < 192 || count == 0 ? (count == 0 ? 0 : UInt32(b) % count) : script.pick([count, count + 1, UInt32.max])
        do {
            switch script.byte() % 3 {
            case 0:
                let (_, size) = try ledger.verified(entry)
                precondition(size == entries[Int(entry)].size)
            case 1:
                _ = try ledger.failed(EntryFailure(entry: entry, code: .io, message: "no"))
            default:
                let complete = Complete(succeeded: script.number32(), failed: script.number32())
                let succeeded = try ledger.complete(complete)
                precondition(ledger.unanswered == 0 && succeeded + ledger.failures.count <= entries.count, "an impossible Complete was accepted")
                return
            }
        } catch {
            check(error, "verdict")
            precondition(error.code == .protocolViolation, "verdict refused with \(error.code)")
            return
        }
    }
}

/// A stream of Continuations only (issue 66: a drip that never sends the Offer's last part):
/// parts of every size from the smallest allowed up, naming an Offer, an Accept or neither,
/// sometimes broken by another frame. Oracles: no message comes out of Continuations alone;
/// the assembler stays partial after each one it takes; every refusal is a one-line
/// TransferError, after which the stream is over (the receiver closes).
func fuzzContinuationOnly(_ script: inout Script) {
    var assembler = MessageAssembler()
    var taken = 0
    while !script.isEmpty {
        let type: UInt32
        var part: [UInt8] = []
        switch script.byte() % 8 {
        case 0: type = MessageType.fileData.rawValue  // a frame other than a part, in between
        case 1: type = MessageCodec.continuationType; part = [0, 0, 0, UInt8(script.byte() % 14)]  // any inner type
        default: type = MessageCodec.continuationType; part = [0, 0, 0, script.byte() & 1 == 0 ? 1 : 2]
        }
        if type == MessageCodec.continuationType {
            // Mostly the 5-byte drip; sometimes longer, up to a few KiB.
            let extra = script.byte() < 200 ? Int(script.byte() % 4) : Int(script.number32() % 4096)
            part += Array(repeating: script.byte(), count: 1 + extra)
        }
        do {
            let message = try assembler.take(type: type, body: Data(part))
            if type == MessageCodec.continuationType {
                precondition(message == nil, "a message out of a Continuation alone")
                precondition(assembler.isPartial, "a Continuation taken but no message under way")
                taken += 1
            }
        } catch {
            precondition(!error.message.contains("\n"), "a multi-line error: \(error.message)")
            return
        }
    }
    precondition(taken == 0 || assembler.isPartial, "parts taken but nothing under way at the end")
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzSession(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    guard let data, size > 0 else { return 0 }
    var script = Script(Array(UnsafeBufferPointer(start: data, count: size)))
    let first = script.byte()
    if first >= 0xF0 {
        // Seeds and corpus from before begin with 0 or 1: their meaning does not change.
        fuzzContinuationOnly(&script)
    } else if first & 1 == 0 {
        fuzzReceiver(&script)
    } else {
        fuzzSender(&script)
    }
    return 0
}
