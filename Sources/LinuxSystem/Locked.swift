import Glibc

/// State shared between tasks and threads, behind a pthread mutex. Not the standard library's
/// `Mutex`: on Linux that is a futex ThreadSanitizer cannot see, so it reported every pair of
/// accesses inside one as a race (docs/SECURITY.md, "Sanitizers"). A class, so the closures of
/// a task group can share it (a `Mutex` is not copyable).
public final class Locked<Value>: @unchecked Sendable {
    // @unchecked: `value` is only touched with `mutex` held; the mutex lives at a fixed address.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    public init(_ value: sending Value) {
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
    public func withLock<Result, Failure: Error>(_ body: (inout sending Value) throws(Failure) -> sending Result) throws(Failure) -> sending Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
