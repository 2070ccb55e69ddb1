import Glibc

/// A thread of its own for blocking work (fsync, a blocking read) that must stay off Swift's
/// cooperative pool, which has one thread per core: started detached, it ends with its work.
public enum DetachedThread {
    /// Runs `body` on a new thread, or on the caller's if the system cannot create one (out of
    /// memory, or the process's thread limit).
    public static func run(_ body: @escaping @Sendable () -> Void) {
        if !start(body) { body() }
    }

    /// Runs `body` on a new thread; false, with `body` not run, if none can be created.
    private static func start(_ body: @escaping @Sendable () -> Void) -> Bool {
        let context = Unmanaged.passRetained(Work(body)).toOpaque()
        var thread = pthread_t()
        let result = pthread_create(&thread, nil, { context in
            let work = Unmanaged<Work>.fromOpaque(context!).takeRetainedValue()
            work.body()
            return nil
        }, context)
        guard result == 0 else {
            Unmanaged<Work>.fromOpaque(context).release()
            return false
        }
        pthread_detach(thread)
        return true
    }

    private final class Work: Sendable {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
}
