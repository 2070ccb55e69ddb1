@_spi(Stacks) import QXferCore

/// The bytes a listener's connections may read ahead of their readers, all together.
///
/// Each connection reads up to ``InboundBridge/floor`` ahead of its reader on its own, and up to
/// its full mark (1 MiB, which spares a bulk receiver most wake-ups) only while it holds a share
/// of this budget. Without a bound across connections, any client that can connect made the
/// receiver hold about 2 MiB per connection by announcing a message that waits for the framers'
/// allowance: 430 connections filled a 1 GiB container. Once the budget is spent, a connection
/// reads ahead at most the floor, or what its waiting reader needs: a legitimate sender who
/// arrives during a flood is read as fast as its messages are taken, never refused.
final class ReadAheadBudget: Sendable {
    private let bytes: Int
    private let reserved = Locked<Int>(0)

    init(bytes: Int) { self.bytes = max(0, bytes) }

    /// Takes `count` bytes of the budget if that many are left.
    func reserve(_ count: Int) -> Bool {
        reserved.withLock { used in
            guard count <= bytes - used else { return false }
            used += count
            return true
        }
    }

    /// Gives back bytes taken with ``reserve(_:)``.
    func release(_ count: Int) {
        reserved.withLock { used in used = max(0, used - count) }
    }

    /// Bytes currently reserved.
    var inUse: Int { reserved.withLock { $0 } }
}
