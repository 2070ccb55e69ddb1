import Synchronization

/// A value shared between the tasks of a transfer, behind a lock. (`Mutex` itself cannot be
/// captured by the closures of a task group: it is not copyable.)
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<R>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
}
