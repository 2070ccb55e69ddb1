import Glibc
internal import CQXferLinux

/// glibc's allocator, as a process tunes it.
public enum MallocArenas {
    /// Caps the number of malloc arenas; false if glibc refused. The corresponding glibc call
    /// is `mallopt(M_ARENA_MAX, count)`.
    @discardableResult
    public static func limit(to count: Int32) -> Bool {
        cqxfer_limit_malloc_arenas(count) == 1
    }

    /// Gives the free pages inside the heap back to the system (`malloc_trim(0)`): glibc returns
    /// only a free top of the heap on its own, so a long-running process that once held much
    /// (a receiver after a large offer) would keep that much resident while idle.
    public static func giveBackFreePages() {
        _ = cqxfer_malloc_trim()
    }

    /// Keeps freed blocks of up to `largestBlock` bytes for reuse, and up to `retained` bytes of
    /// freed memory before any goes back to the system; false if glibc refused. The
    /// corresponding glibc calls are `mallopt(M_MMAP_THRESHOLD, largestBlock)` and
    /// `mallopt(M_TRIM_THRESHOLD, retained)`.
    ///
    /// By default glibc maps blocks of 128 KiB and more afresh (its threshold rises only to
    /// the largest block freed so far) and gives the top of the heap back once 2 × that is
    /// free, so a program that allocates and frees a buffer of a MiB per chunk it moves touches
    /// new pages all the time: each first touch is a page fault (zeroing, and on a VM that
    /// hands free memory back to its host, the host's work too).
    @discardableResult
    public static func keepFreedBlocks(upTo largestBlock: Int32, retaining retained: Int32) -> Bool {
        cqxfer_keep_freed_blocks(largestBlock, retained) == 1
    }
}

/// How many files a process may hold open.
public enum OpenFileLimit {
    /// Raises the soft limit on open files to the hard one (``current`` tells the result).
    /// Many systems start programs at 1 024 (the soft limit, kept low for `select(2)`) below a
    /// hard limit of hundreds of thousands; qxfer uses no `select`, and a receiver of many
    /// small files holds a descriptor for each file being committed.
    public static func raiseToHard() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }

    /// The limit on open files in force (the soft one).
    public static var current: UInt64 {
        var limit = rlimit()
        return getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 ? UInt64(limit.rlim_cur) : 1024
    }
}

/// Space a file occupies on disk.
public enum FileSpace {
    /// Frees the blocks of `[offset, offset + length)` of the open file `descriptor` and keeps
    /// its size; false where the file system cannot. The corresponding Linux call is
    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`.
    public static func punchHole(descriptor: Int32, offset: Int64, length: Int64) -> Bool {
        cqxfer_punch_hole(descriptor, offset, length) == 0
    }

    /// The offset of the first data at or after `offset` in the open file `descriptor`
    /// (`lseek(SEEK_DATA)`); -1 with errno set, ENXIO when there is none.
    public static func nextData(descriptor: Int32, from offset: Int64) -> Int64 {
        cqxfer_seek_data(descriptor, offset)
    }

    /// The offset of the first hole at or after `offset` (`lseek(SEEK_HOLE)`; the end of the
    /// file counts as one); -1 with errno set.
    public static func nextHole(descriptor: Int32, from offset: Int64) -> Int64 {
        cqxfer_seek_hole(descriptor, offset)
    }
}

/// The memory this process can have: the machine's, or less where a control group caps it.
public enum UsableMemory {
    /// The smaller of the machine's physical memory and the memory limit of this process's
    /// control group or any group above it (cgroup v2 `memory.max`, v1
    /// `memory.limit_in_bytes`). A container or a systemd unit with `MemoryMax=` runs on a
    /// machine of many gigabytes but is killed at its own limit.
    public static var bytes: Int {
        let pages = sysconf(Int32(_SC_PHYS_PAGES)), pageSize = sysconf(Int32(_SC_PAGESIZE))
        let physical = pages > 0 && pageSize > 0 ? pages.multipliedReportingOverflow(by: pageSize) : (partialValue: 0, overflow: true)
        let machine = physical.overflow || physical.partialValue == 0 ? Int.max : physical.partialValue
        return min(machine, controlGroupLimit(membership: readSmallFile("/proc/self/cgroup") ?? "", read: readSmallFile) ?? Int.max)
    }

    /// A share of ``bytes``: `numerator / denominator` of it, within `floor ... ceiling`.
    public static func share(_ numerator: Int, of denominator: Int, atLeast floor: Int, atMost ceiling: Int) -> Int {
        let (part, overflow) = (bytes / max(1, denominator)).multipliedReportingOverflow(by: max(0, numerator))
        return min(max(overflow ? Int.max : part, floor), ceiling)
    }

    /// The lowest memory limit on the way from the root to this process's group, as the
    /// `/proc/self/cgroup` text `membership` names it; nil when none is set. `read` gives a
    /// file's text, nil when it cannot be read.
    static func controlGroupLimit(membership: String, read: (String) -> String?) -> Int? {
        var lowest: Int?
        for line in membership.split(separator: "\n") {
            // "0::/path" is the v2 hierarchy, "N:memory:/path" (or "N:cpu,memory:/path") v1's.
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3 else { continue }
            let root: String, file: String
            if fields[0] == "0" && fields[1].isEmpty {
                (root, file) = ("/sys/fs/cgroup", "memory.max")
            } else if fields[1].split(separator: ",").contains("memory") {
                (root, file) = ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
            } else {
                continue
            }
            var folder = root
            let steps = fields[2].split(separator: "/").filter { $0 != ".." }
            for index in 0...steps.count {
                if index > 0 { folder += "/" + steps[index - 1] }
                // "max" (v2) or a number near Int64.max (v1) means no limit.
                guard let text = read(folder + "/" + file), let limit = Int(text.split(whereSeparator: \.isWhitespace).first ?? ""),
                      limit > 0, limit < Int.max / 2 else { continue }
                lowest = min(lowest ?? limit, limit)
            }
        }
        return lowest
    }

    private static func readSmallFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 4096)
        let n = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        return String(decoding: bytes[..<n], as: UTF8.self)
    }
}
