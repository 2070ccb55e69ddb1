import NIOConcurrencyHelpers

/// State shared between the tasks of a transfer, behind a pthread mutex (NIO's
/// `NIOLockedValueBox`). Not the standard library's `Mutex`: on Linux that is a futex
/// ThreadSanitizer cannot see, so it reported every pair of accesses inside one as a race
/// (docs/SECURITY.md, "Sanitizers"). Copies share one value, so a task group's closures can.
struct Locked<Value: Sendable>: Sendable {
    private let box: NIOLockedValueBox<Value>
    init(_ value: Value) { box = NIOLockedValueBox(value) }

    /// Runs `body` with the value, holding the lock.
    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        try box.withLockedValue(body)
    }
}
