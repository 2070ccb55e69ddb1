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
