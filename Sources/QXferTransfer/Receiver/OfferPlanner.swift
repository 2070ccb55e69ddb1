import Glibc
#if canImport(PlainText)
internal import PlainText
#endif

/// The receiver's decisions about an offer before it answers, apart from any connection (so
/// fuzz/harness/FuzzSession.swift drives them with hostile values): every path checked, the
/// sizes added without overflow, and what to do with each entry given what is on disk.
struct OfferPlanner {
    /// The most entries accepted in one offer.
    var maximumEntries: Int
    /// Whether a verified file may replace an existing one of another size.
    var overwrite: Bool

    /// The bytes of all files of known size, or nil when they add up past UInt64 (a hostile
    /// offer: two files of 2^63 bytes).
    static func totalSize(of entries: [OfferEntry]) -> UInt64? {
        var total: UInt64 = 0
        for entry in entries {
            let (sum, overflow) = total.addingReportingOverflow(entry.size)
            if overflow { return nil }
            total = sum
        }
        return total
    }

    /// Every path safe, no duplicates, nothing under a non-directory of the same offer,
    /// fields consistent with the kind, a total size that fits in 64 bits. One bad entry
    /// refuses the whole offer.
    func check(_ offer: Offer) throws(TransferError) -> [SafePath] {
        guard offer.entries.count <= maximumEntries else {
            throw TransferError(.limitExceeded, "\(offer.entries.count) entries offered; this receiver accepts at most \(maximumEntries)")
        }
        guard OfferPlanner.totalSize(of: offer.entries) != nil else {
            throw TransferError(.limitExceeded, "the offered files add up to more than \(UInt64.max) bytes")
        }
        // Every path and prefix seen is a node, named by its parent's node and its last
        // component, so each entry costs a lookup per component, not a path per prefix (an
        // offer of a million paths 64 deep would otherwise hash 2 000 components an entry).
        var nodes: [PathNode: Int] = [:]
        var kinds: [EntryKind?] = []
        var paths: [SafePath] = []
        paths.reserveCapacity(offer.entries.count)
        for entry in offer.entries {
            let path = try SafePath(validating: entry.path)
            var node = -1
            for (depth, component) in path.components.enumerated() {
                if depth > 0, let kind = kinds[node], kind != .directory {
                    throw TransferError(.unsafePath, "'\(path)' is offered inside '\(path.components[0..<depth].joined(separator: "/"))', which is not a directory")
                }
                let key = PathNode(parent: node, name: ExactString(component))
                if let known = nodes[key] {
                    node = known
                } else {
                    node = kinds.count
                    kinds.append(nil)
                    nodes[key] = node
                }
            }
            guard kinds[node] == nil else { throw TransferError(.unsafePath, "'\(path)' is offered twice") }
            switch entry.kind {
            case .symlink:
                try path.validateLinkTarget(entry.linkTarget)
            case .directory, .file:
                guard entry.linkTarget.isEmpty else { throw TransferError(.malformed, "'\(path)' is not a symlink but has a link target") }
            }
            guard entry.kind == .file || entry.size == 0, !entry.flags.contains(.sizeUnknown) || (entry.kind == .file && entry.size == 0) else {
                throw TransferError(.malformed, "'\(path)' has a size that does not fit its kind")
            }
            kinds[node] = entry.kind
            paths.append(path)
        }
        return paths
    }

    /// An Accept in parts only to a sender that takes one (docs/PROTOCOL.md §3.9): one longer
    /// than a frame, to an offer without the `long` flag, is `limit-exceeded`.
    static func checkAnswersFit(_ answers: some Sequence<EntryAnswer>, to offer: Offer) throws(TransferError) {
        guard offer.flags.contains(.long) || MessageCodec.acceptBodySize(answers) <= ProtocolLimits.maximumMessageSize else {
            throw TransferError(.limitExceeded, "the answer to \(offer.entries.count) items would be longer than the sender's qxfer takes (16 MiB); update it, or send fewer items at once")
        }
    }

    /// What to do with each entry given what is on disk; checks the free space (unless the offer
    /// may send Zeros). The files at `heldElsewhere` (entry indices) are another transfer's
    /// right now: one that would be written is skipped `busy`, its partial neither read nor
    /// counted (one that transfer has finished is compared as any existing file is).
    func plan(_ offer: Offer, paths: [SafePath], store: FileStore, heldElsewhere: Set<Int> = []) throws(TransferError) -> [Plan] {
        var plans: [Plan] = []
        plans.reserveCapacity(offer.entries.count)
        var needed: UInt64 = 0
        let traits = store.directory.fileSystemTraits()
        var sameInAnyCase = traits.foldsCase ? SameInAnyCase() : nil
        let largest = FileSizeCeiling(fileSystemLimit: traits.largestFile)
        for (index, (entry, path)) in zip(offer.entries, paths).enumerated() {
            if let earlier = sameInAnyCase?.earlier(than: path, kind: entry.kind) {
                plans.append(.skip(TransferError(.exists, "'\(path)' and '\(earlier)' are one name on the receiving file system, which does not tell upper from lower case; '\(earlier)' is received")))
                continue
            }
            let state: TargetDirectory.EntryState
            do {
                state = try store.directory.state(of: path)
            } catch where error.code == .unsafePath {
                // A folder on its way is a file or a symlink here. That folder's own entry is
                // skipped `exists` (below), and so is everything offered inside it; declining
                // the whole offer for it kept the rest from arriving too.
                plans.append(.skip(TransferError(.exists, error.message)))
                continue
            }
            switch entry.kind {
            case .directory:
                plans.append(state == .absent || state == .directory ? .directory : .skip(TransferError(.exists, "'\(path)' exists and is not a directory")))
            case .symlink:
                // Answered now, not found out after the files: an existing link is fine only
                // when it is the same link.
                if state == .absent || (state == .symlink && store.directory.linkTarget(of: path).map(ExactString.init) == ExactString(entry.linkTarget)) {
                    plans.append(.symlink)
                } else {
                    plans.append(.skip(TransferError(.exists, state == .symlink ? "'\(path)' exists as a symlink to somewhere else" : "'\(path)' exists and is not a symlink")))
                }
            case .file:
                let size: UInt64? = entry.flags.contains(.sizeUnknown) ? nil : entry.size
                let target = FileTarget(path: path, size: size, mode: entry.mode, modificationTime: entry.modificationTime, algorithm: offer.algorithm)
                let replaceable = if case .regularFile = state { overwrite } else { false }
                switch state {
                case .regularFile(let existing) where size == existing && !overwrite:
                    plans.append(.present(target, digest: try store.digestOfExisting(target)))
                case _ where (state == .absent || replaceable) && largest.refuses(size):
                    plans.append(.skip(largest.error(for: path, size: size ?? 0)))
                case _ where (state == .absent || replaceable) && heldElsewhere.contains(index):
                    plans.append(.skip(TransferError(.busy, "'\(path)' is being received by another transfer right now")))
                case _ where state == .absent || replaceable:
                    // An early file comes whole from byte 0, whatever a journal holds (§3.7).
                    let resume = entry.flags.contains(.early) ? .start(offer.algorithm) : try store.resumeOffset(for: target)
                    // The journal matched this size, so the offset is within it; the sum of
                    // sizes was checked to fit.
                    let (rest, below) = (size ?? 0).subtractingReportingOverflow(resume.offset)
                    let (sum, over) = needed.addingReportingOverflow(below ? 0 : rest)
                    needed = over ? .max : sum
                    plans.append(.receive(target, resume))
                case .regularFile:
                    plans.append(.skip(TransferError(.exists, "'\(path)' exists with another size; not overwriting it")))
                default:
                    plans.append(.skip(TransferError(.exists, "'\(path)' exists and is not a regular file")))
                }
            }
        }
        // An offer that may send Zeros says its files' sizes, not how much of them is holes,
        // which take no space: a disk image larger than the free space may well fit. Running
        // out of space while writing stops the transfer resumably, as for any file.
        if !offer.flags.contains(.zeros) { try store.checkFreeSpace(for: needed) }
        return plans
    }
}

/// The largest file the receiver can write into its folder: the file system's limit (FAT32's
/// 4 GiB less a byte) or the process's file size limit (`ulimit -f`), whichever is lower. A
/// file above it is skipped `too-large` before a byte moves, instead of failing with "File too
/// large" once that many bytes have crossed the network.
struct FileSizeCeiling {
    private var bytes = UInt64.max
    private var isProcessLimit = false

    /// `fileSystemLimit`: the receiving folder's ``TargetDirectory/FileSystemTraits/largestFile``.
    init(fileSystemLimit: UInt64?) {
        if let fileSystemLimit { bytes = fileSystemLimit }
        var limit = rlimit()
        // RLIM_INFINITY is all ones (Swift cannot import its -1).
        if getrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max, UInt64(limit.rlim_cur) < bytes {
            (bytes, isProcessLimit) = (UInt64(limit.rlim_cur), true)
        }
    }

    /// Whether a file of `size` bytes (nil: unknown) cannot be written here whole.
    func refuses(_ size: UInt64?) -> Bool {
        size.map { $0 > bytes } ?? false
    }

    /// Why a file of `size` bytes at `path`, which this ceiling ``refuses(_:)``, is skipped.
    func error(for path: SafePath, size: UInt64) -> TransferError {
        let at = "at most \(TextFormat.bytes(bytes)) (\(bytes) bytes)"
        let limit = isProcessLimit ? "this receiver may write files of \(at): its file size limit, ulimit -f"
            : "the file system here holds files of \(at)" + (bytes == 0xFFFF_FFFF ? ": FAT32's limit, 4 GiB less a byte" : "")
        return TransferError(.tooLarge, "'\(path)' is \(TextFormat.bytes(size)); \(limit)")
    }
}

/// On a file system that does not tell upper from lower case, the entries that would land on
/// an earlier one's name: two files "Big.bin" and "big.bin" would both be written into one file
/// (and a FUSE exFAT driver was seen to crash on it). Folders of the same name in another case
/// are one folder there, as `cp` makes them: what is inside them lands together.
struct SameInAnyCase {
    private var seen: [ExactString: (path: SafePath, kind: EntryKind)] = [:]

    /// The earlier entry `path` would land on, if any; records `path` otherwise. The paths
    /// come checked: no two are the same bytes.
    mutating func earlier(than path: SafePath, kind: EntryKind) -> SafePath? {
        let key = ExactString(path.components.map { $0.lowercased() }.joined(separator: "/"))
        if let first = seen[key], !(first.kind == .directory && kind == .directory) {
            return first.path
        }
        if seen[key] == nil { seen[key] = (path, kind) }
        return nil
    }
}

/// A path as the planner's index of an offer holds it: the node of its parent (-1 for none)
/// and its last component, byte for byte.
private struct PathNode: Hashable {
    var parent: Int
    var name: ExactString
}

/// What the receiver does with one entry.
enum Plan {
    case directory
    case symlink
    case receive(FileTarget, ResumePoint)
    case present(FileTarget, digest: [UInt8])
    case skip(TransferError)

    var answer: EntryAnswer {
        switch self {
        case .directory, .symlink: .sendAll
        case .receive(_, let resume): EntryAnswer(disposition: .send, offset: resume.offset, prefixDigest: resume.prefixDigest)
        case .present(_, let digest): EntryAnswer(disposition: .present, prefixDigest: digest)
        case .skip(let error): EntryAnswer(disposition: .skip, code: error.code.rawValue)
        }
    }
}
