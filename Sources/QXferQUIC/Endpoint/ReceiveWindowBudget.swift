import QUICEngine
@_spi(Stacks) import QXferCore

/// The connection receive windows a listener's connections may advertise, all together.
///
/// A connection's window is what its peer may send that the application has not read yet, and
/// the engine holds those bytes. A bulk listener offers 32 MiB per connection (8 MiB on
/// loopback) so that a long fat path is never held back; without a bound across connections,
/// any client that can connect made the receiver hold that much per connection by sending on
/// a stream nobody reads, or while a message waits for the framers' allowance: 4096
/// connections, 128 GiB. Each new connection's window is capped by what is left of the budget;
/// once it is spent, a new connection still gets ``floor``, so the engines hold at most the
/// budget plus ``floor`` per connection (4096 × 256 KiB = 1 GiB), and a legitimate sender who
/// arrives during a flood is slowed, not refused.
final class ReceiveWindowBudget: Sendable {
    /// The window a connection gets when the budget is spent.
    static let floor: UInt64 = 256 << 10

    /// The windows' sum that later connections stay under (beyond their floors).
    let bytes: UInt64
    private let granted = Locked<UInt64>(0)

    init(bytes: UInt64) { self.bytes = bytes }

    /// Takes a window of at most `wanted` bytes for a new connection: what is left of the
    /// budget, at least ``floor`` (or `wanted`, if smaller). Give it back with ``giveBack(_:)``.
    func take(upTo wanted: UInt64) -> UInt64 {
        granted.withLock { used in
            let left = bytes > used ? bytes - used : 0
            let grant = min(wanted, max(Self.floor, left))
            let (sum, overflow) = used.addingReportingOverflow(grant)
            used = overflow ? .max : sum
            return grant
        }
    }

    /// Takes a window for a new connection of `configuration` and lowers its connection
    /// window (first advertised and ceiling) to it; returns the window to give back.
    ///
    /// A connection whose first window is lowered resumes no session, so takes no early data:
    /// a client sends early data within the windows of the connection its ticket came from, and
    /// one that finds them lowered after its early data was taken must fail the connection
    /// (RFC 9000 §7.4.1; ngtcp2 does). Refused, the ticket costs a full handshake instead.
    func limit(_ configuration: inout QUICConfiguration) -> UInt64 {
        let window = take(upTo: max(configuration.initialConnectionWindow, configuration.maxConnectionWindow))
        if window < configuration.initialConnectionWindow {
            configuration.initialConnectionWindow = window
            configuration.sessionTickets = nil
        }
        configuration.maxConnectionWindow = min(configuration.maxConnectionWindow, window)
        return window
    }

    /// Returns a window taken with ``take(upTo:)`` once its connection has ended.
    func giveBack(_ grant: UInt64) {
        granted.withLock { used in used = used > grant ? used - grant : 0 }
    }

    /// Bytes of windows currently taken.
    var taken: UInt64 { granted.withLock { $0 } }
}
