internal import CQXferLinux

/// glibc's allocator, as a process tunes it.
public enum MallocArenas {
    /// Caps the number of malloc arenas; false if glibc refused. The corresponding glibc call
    /// is `mallopt(M_ARENA_MAX, count)`.
    @discardableResult
    public static func limit(to count: Int32) -> Bool {
        cqxfer_limit_malloc_arenas(count) == 1
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
}
