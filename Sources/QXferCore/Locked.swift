import NIOConcurrencyHelpers

/// State shared between threads (event loops, tasks), behind a lock: `Synchronization.Mutex`'s
/// `withLock`, on a pthread mutex (NIO's `NIOLockedValueBox`). ThreadSanitizer sees the order a
/// pthread mutex imposes; on Linux it does not see the standard library's `Mutex` (a futex behind
/// uninstrumented atomics) and reports every pair of accesses inside one as a race, which hid any
/// real report among false ones (docs/SECURITY.md, §5).
@_spi(Stacks) public struct Locked<Value: Sendable>: Sendable {
    private let box: NIOLockedValueBox<Value>

    @_spi(Stacks) public init(_ value: Value) { box = NIOLockedValueBox(value) }

    /// Runs `body` with the value, holding the lock.
    @_spi(Stacks) public func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        try box.withLockedValue(body)
    }
}
