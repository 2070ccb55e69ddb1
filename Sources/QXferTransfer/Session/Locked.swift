import Glibc

/// State shared between the tasks of a transfer, behind a pthread mutex. Not the standard
/// library's `Mutex`: on Linux that is a futex ThreadSanitizer cannot see, so it reported every
/// pair of accesses inside one as a race (docs/SECURITY.md, "Sanitizers"). A class, so the
/// closures of a task group can share it (a `Mutex` is not copyable).
final class Locked<Value: Sendable>: @unchecked Sendable {
    // @unchecked: `value` is only touched with `mutex` held; the mutex lives at a fixed address.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with the value, holding the lock.
    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
