/// The sender's account of the receiver's answers, apart from any connection (so
/// fuzz/harness/FuzzSession.swift drives it with hostile values): whether Accept fits the
/// offer, which Verified and Failed may come, and whether Complete's counts add up. Every
/// number the receiver sends is checked before it is used as an index, an offset or a count;
/// a receiver that breaks a rule gets `protocol-violation`.
struct SenderLedger {
    /// A file to send (or, when `present`, only to hash) and the receiver's answer for it.
    struct Job {
        var index: UInt32
        var answer: EntryAnswer
    }

    let entries: [OfferEntry]
    /// Files to send or compare, in offer order.
    private(set) var jobs: [Job] = []
    /// Entries skipped in Accept and entries the receiver reported Failed.
    private(set) var failures: [(path: String, error: TransferError)] = []
    /// Bytes the receiver said it held (resume offsets).
    private(set) var resumedBytes: UInt64 = 0
    /// Bytes to send after the resume offsets.
    private(set) var bytesToSend: UInt64 = 0
    /// Files that still owe exactly one Verified or Failed.
    private var awaitingVerdict: Set<UInt32> = []
    /// Folders and symlinks answered `send`: the receiver may report one Failed for each.
    private var mayFail: Set<UInt32> = []

    /// Checks the receiver's answers against the offer (docs/PROTOCOL.md §3.2).
    init(entries: [OfferEntry], algorithm: DigestAlgorithm, answers: [EntryAnswer]) throws(TransferError) {
        self.entries = entries
        guard answers.count == entries.count else {
            throw TransferError(.protocolViolation, "the receiver answered \(answers.count) entries of \(entries.count)")
        }
        var caseFolded: [String: Int]?  // built at the first `exists`
        var skippedFolders: Set<ExactString> = []  // paths as shown
        for (index, (entry, answer)) in zip(entries, answers).enumerated() {
            let isSizedFile = entry.kind == .file && !entry.flags.contains(.sizeUnknown)
            let offsetFits = answer.offset == 0 || (isSizedFile && answer.disposition == .send && answer.offset <= entry.size)
            let presentFits = answer.disposition != .present || isSizedFile
            let digestFits = answer.prefixDigest.isEmpty || answer.prefixDigest.count == algorithm.digestLength
            // An early file was sent whole already: it cannot be resumed (docs/PROTOCOL.md §3.7).
            let earlyFits = !entry.flags.contains(.early) || answer.offset == 0
            guard offsetFits, presentFits, digestFits, earlyFits else {
                throw TransferError(.protocolViolation, "the receiver's answer for '\(Self.shown(entry))' does not fit the offer")
            }
            let number = UInt32(index)  // index < entries.count, which the codec bounds to 1 000 000
            switch answer.disposition {
            case .skip:
                let code = TransferError.Code(rawValue: answer.code)
                var reason = Self.skipped(code)
                // A folder comes before what it holds: what is inside one skipped was skipped for it.
                if code == .exists, let folder = Self.enclosingFolder(of: entry, among: skippedFolders) {
                    reason = "it is inside '\(folder)', which was not transferred either"
                } else if code == .exists {
                    let firsts = caseFolded ?? Self.firstOfEachCaseFoldedPath(entries)
                    caseFolded = firsts
                    // A receiver whose file system does not tell upper from lower case skips the
                    // later of two names that differ only in case (docs/PROTOCOL.md §6).
                    if let first = firsts[Self.caseFolded(entry)], first < index {
                        reason = "its name and '\(Self.shown(entries[first]))' differ only in case, which the receiving file system does not tell apart; that one is received"
                    }
                }
                failures.append((Self.shown(entry), TransferError(code, reason)))
                if entry.kind == .directory { skippedFolders.insert(ExactString(Self.shown(entry))) }
            case .send, .present:
                guard entry.kind == .file else {
                    mayFail.insert(number)
                    continue
                }
                jobs.append(Job(index: number, answer: answer))
                awaitingVerdict.insert(number)
                if answer.disposition == .send {
                    resumedBytes = resumedBytes.saturatingAdd(answer.offset)
                    bytesToSend = bytesToSend.saturatingAdd(entry.size - answer.offset)  // offset <= size, checked above
                }
            }
        }
    }

    /// Why the receiver skipped an entry, from the code of its answer (which carries no text).
    static func skipped(_ code: TransferError.Code) -> String {
        switch code {
        case .exists: "the receiver already has something else under that name and keeps it (a file of another size is replaced only by recv --overwrite)"
        case .busy: "the receiver is receiving it from another sender right now; send it again once that ends"
        case .unsafePath: "the receiver refused its name or link target"
        case .noSpace: "the receiver has no space left for it"
        case .tooLarge: "it is larger than the receiving file system (or the receiver's file size limit) lets one file be"
        case .io: "the receiver could not write it"
        case .unsupported: "the receiver does not support it"
        default: "the receiver skipped it (\(code.name))"
        }
    }

    /// Files sent or compared whose verdict has not come yet.
    var unanswered: Int { awaitingVerdict.count }

    /// Records a Verified; returns the file's path and size.
    mutating func verified(_ entry: UInt32) throws(TransferError) -> (path: String, size: UInt64) {
        guard awaitingVerdict.remove(entry) != nil else {
            throw TransferError(.protocolViolation, "the receiver verified entry \(entry), which was not sent or was answered already")
        }
        return (Self.shown(entries[Int(entry)]), entries[Int(entry)].size)
    }

    /// Records a Failed for a file, or for a folder or symlink the receiver could not make; for
    /// a file this sender gave up (it could not read it), its `own` reason rather than the echo.
    mutating func failed(_ failure: EntryFailure, own: TransferError? = nil) throws(TransferError) -> (path: String, error: TransferError) {
        guard awaitingVerdict.remove(failure.entry) != nil || mayFail.remove(failure.entry) != nil else {
            throw TransferError(.protocolViolation, "the receiver reported entry \(failure.entry) failed, which was not sent or was answered already")
        }
        let recorded = (Self.shown(entries[Int(failure.entry)]), own ?? TransferError(failure.code, "the receiver: \(failure.message)"))
        failures.append(recorded)
        return recorded
    }

    /// Checks Complete: it comes after every file's verdict and counts every entry once.
    /// Returns the number of entries that succeeded.
    func complete(_ complete: Complete) throws(TransferError) -> Int {
        guard awaitingVerdict.isEmpty else {
            throw TransferError(.protocolViolation, "the receiver completed with \(awaitingVerdict.count) files unanswered")
        }
        guard UInt64(complete.succeeded) + UInt64(complete.failed) == UInt64(entries.count), Int(complete.failed) >= failures.count else {
            throw TransferError(.protocolViolation, "the receiver completed with \(complete.succeeded) succeeded and \(complete.failed) failed for \(entries.count) entries, \(failures.count) of them failed")
        }
        return Int(complete.succeeded)
    }

    private static func shown(_ entry: OfferEntry) -> String { entry.path.joined(separator: "/") }

    /// The outermost of `folders` that holds `entry`, if any.
    private static func enclosingFolder(of entry: OfferEntry, among folders: Set<ExactString>) -> String? {
        guard !folders.isEmpty else { return nil }
        for depth in 1..<max(entry.path.count, 1) {
            let folder = entry.path[..<depth].joined(separator: "/")
            if folders.contains(ExactString(folder)) { return folder }
        }
        return nil
    }

    private static func caseFolded(_ entry: OfferEntry) -> String { entry.path.map { $0.lowercased() }.joined(separator: "/") }

    /// For each path as a file system that does not tell case apart sees it, its first entry.
    private static func firstOfEachCaseFoldedPath(_ entries: [OfferEntry]) -> [String: Int] {
        var firsts: [String: Int] = [:]
        for (index, entry) in entries.enumerated().reversed() {
            firsts[caseFolded(entry)] = index  // the earliest is written last
        }
        return firsts
    }
}
