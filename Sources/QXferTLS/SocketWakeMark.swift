import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// A TCP socket's `SO_RCVLOWAT`, raised while a reader waits for the rest of a large message,
/// so the event loop wakes once per few hundred KiB instead of once per burst of segments.
///
/// On a slow long path the kernel wakes a reader for every 20-30 KB that arrive; the receiver
/// then spent more CPU on waking (epoll, futex, context switches) than on the bytes: 25 CPU
/// seconds per GB at 100 Mbit/s and 200 ms RTT.
///
/// The kernel wakes the loop once the socket holds the mark, when its window nearly closes, or
/// under memory pressure, and for nothing else. So the mark must stay reachable:
/// - never more than the peer is bound to send: what the reader still needs, less the one TLS
///   record the TLS handler may hold half-read;
/// - well below the receive buffer: a mark the buffer cannot hold makes the kernel grow the
///   buffer and clamp the window to the mark;
/// - back to 1 after ``patience`` without reaching it, so a stalled or slow peer's bytes still
///   reach the reader (and the idle timer sees them).
struct SocketWakeMark {
    /// The largest TLS record, header and ciphertext (RFC 8446 section 5.2): what the TLS
    /// handler may have taken from the socket without a byte of it reaching the reader.
    static let largestHeldRecord = 5 + (1 << 14) + 256
    /// What one wake reads (NIO's 4 reads of up to 64 KiB).
    static let largest = 256 << 10
    /// Below this a mark saves too little to be worth its system call; marks move in steps
    /// of it, so a shrinking need changes the mark rarely.
    static let step = 32 << 10
    /// How long a raised mark may go unreached before it is dropped to 1.
    static let patience = TimeAmount.milliseconds(50)

    /// The mark for a reader that misses `missing` bytes, on a socket whose receive buffer
    /// holds `receiveBuffer`: 1 (wake for any byte) when a mark would not pay.
    static func mark(missing: Int, receiveBuffer: Int) -> Int {
        let (reachable, overflow) = missing.subtractingReportingOverflow(largestHeldRecord)
        guard !overflow else { return 1 }
        let wanted = min(reachable, largest, receiveBuffer / 4)
        return wanted >= step ? wanted / step * step : 1
    }

    /// Where the mark goes.
    private let socket: any WakeMarkSocket
    private let eventLoop: any EventLoop
    /// The mark set on the socket now.
    private(set) var current = 1
    /// Drops a raised mark that was not reached in time.
    private var fallback: Scheduled<Void>?
    /// Set once the socket refused a mark: it wakes for every byte from then on.
    private var refused = false

    init(socket: any WakeMarkSocket, eventLoop: any EventLoop) {
        self.socket = socket
        self.eventLoop = eventLoop
    }

    /// Sets the mark for a reader that misses `missing` bytes; called when a reader starts
    /// waiting and after every read. `expired` is called on the event loop if a raised mark goes
    /// unreached for ``patience``; it should call ``drop()``.
    mutating func update(missing: Int, expired: @escaping () -> Void) {
        var wanted = refused ? 1 : Self.mark(missing: missing, receiveBuffer: .max)
        if wanted > 1 {  // only then is the buffer worth a system call
            wanted = socket.receiveBufferSize().map { Self.mark(missing: missing, receiveBuffer: $0) } ?? 1
        }
        if wanted != current { set(wanted) }
        fallback?.cancel()
        fallback = current > 1 ? eventLoop.assumeIsolated().scheduleTask(in: Self.patience, expired) : nil
    }

    /// Back to waking for every byte (at once if some wait in the socket).
    mutating func drop() {
        fallback?.cancel()
        fallback = nil
        if current > 1 { set(1) }
    }

    private mutating func set(_ mark: Int) {
        do {
            try socket.setWakeMark(mark)
            current = mark
        } catch {
            refused = true  // it wakes for every byte, as without a mark
        }
    }
}

/// The socket a ``SocketWakeMark`` is set on.
protocol WakeMarkSocket {
    /// `SO_RCVBUF`: what the kernel lets wait in the socket; nil if unknown.
    func receiveBufferSize() -> Int?
    /// Sets `SO_RCVLOWAT`.
    func setWakeMark(_ bytes: Int) throws
}

/// The TCP socket under a channel, through its options (on the channel's event loop).
struct ChannelSocket: WakeMarkSocket {
    let channel: any Channel

    func receiveBufferSize() -> Int? {
        let option = ChannelOptions.Types.SocketOption(level: SocketOptionLevel(SOL_SOCKET), name: SO_RCVBUF)
        guard let options = channel.syncOptions, let size = try? options.getOption(option) else { return nil }
        return Int(size)
    }

    func setWakeMark(_ bytes: Int) throws {
        let option = ChannelOptions.Types.SocketOption(level: SocketOptionLevel(SOL_SOCKET), name: SO_RCVLOWAT)
        guard let options = channel.syncOptions else { throw ChannelError.operationUnsupported }
        try options.setOption(option, value: SocketOptionValue(clamping: bytes))
    }
}
