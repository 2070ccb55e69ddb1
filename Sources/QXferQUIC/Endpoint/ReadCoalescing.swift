/// When a bulk-transfer socket reads again after a read that brought only a few datagrams.
///
/// On a long path a bulk connection's datagrams trickle in one at a time, each a wake-up of its
/// own: at 500 Mbit/s that is one every 23 µs for the receiver, and one acknowledgement every
/// 190 µs for the sender. Without the GRO batches a LAN's NIC gives (an emulated or tunnelled
/// link delivers packets singly), each wake-up costs an `epoll_wait`, a `recvmmsg` that returns
/// one datagram and another that returns none, a pass through the engine and a send: most of
/// QUIC's CPU per GB on such paths (docs/benchmarks.md, "Fewer wake-ups on long paths").
/// After a small read the socket therefore pauses a small fraction of the round trip (1/50)
/// before it reads again, so that what arrived meanwhile is read, processed and answered
/// together, as a NIC's interrupt coalescing does for the kernel. The pause is at most 1 ms,
/// or up to 4 ms where datagrams come so slowly that a full read's worth (`busyReadMessages`)
/// takes longer than 1 ms to arrive, judged by the read after the pause before.
///
/// The pause is bounded by what it costs: it delays what the connection learns by at most
/// 2 % of a round trip (its RTT samples include it), acknowledgements then cover up to 2 % of
/// a round trip of packets (BBR's model of aggregation absorbs that), and the socket's receive
/// buffer holds the datagrams meanwhile (4 MiB: 1 ms at 30 Gbit/s; a longer pause only where
/// a read's worth takes that long). No pause while any connection of the socket has no RTT
/// sample yet (its handshake is not slowed), on a short path (under 2.5 ms of RTT the pause
/// would be below 50 µs, less than the timer it costs), or after a read that stopped at the
/// channel's limit with more waiting. Only bulk transfers' sockets pause: realtime frames are
/// never held.
struct ReadCoalescing {
    /// The pause is the smoothed RTT divided by this.
    static let roundTripDivisor: Int64 = 50
    /// The longest pause a fast path takes: there 1 ms gathers a full read or more.
    static let fastPathPauseNanoseconds: Int64 = 1_000_000
    /// The longest pause (reached at 200 ms of RTT), taken where datagrams arrive slowly enough
    /// that a shorter one would read fewer than a full read's worth: there 1 ms woke both ends
    /// every few packets (docs/benchmarks.md, "Longer read pauses on slow long paths"). It
    /// stops at what a full read took to arrive, so a fast path's acknowledgements are not held.
    static let maximumPauseNanoseconds: Int64 = 4_000_000
    /// Shorter pauses are not worth a timer: read at once.
    static let minimumPauseNanoseconds: Int64 = 50_000

    /// A read that brought this many messages stopped at the channel's limit, not because the
    /// socket was empty: read on at once.
    let busyReadMessages: Int
    /// Messages read since the socket last asked to read.
    private(set) var messagesSinceRead = 0
    /// The pause before the read now ending, if it followed one.
    private var lastPause: Int64?
    /// Whether the socket's connections are on a path long enough to pause on (as of the last
    /// small read). The socket then answers single datagrams once at the end of each read
    /// instead of after each: what a read brings arrived over up to a pause's time, and its
    /// acknowledgements would leave together anyway. GRO batches are answered one by one.
    private(set) var longPath = false

    /// `busyReadMessages`: the most messages the channel reads before it asks to read again.
    init(busyReadMessages: Int) {
        self.busyReadMessages = busyReadMessages
    }

    /// Counts messages as they are read.
    mutating func receivedMessage() {
        messagesSinceRead &+= 1
    }

    /// Called when the socket would read again: the pause before it does, in nanoseconds, or nil
    /// to read at once. `smallestRoundTrip` gives the smallest smoothed RTT of the socket's
    /// connections in nanoseconds, nil while any of them has no RTT sample; it is asked only
    /// after a read that emptied the socket.
    mutating func pauseBeforeNextRead(smallestRoundTrip: () -> Int64?) -> Int64? {
        let read = messagesSinceRead
        messagesSinceRead = 0
        let pausedBefore = lastPause
        lastPause = nil
        guard read < busyReadMessages else { return nil }
        guard let roundTrip = smallestRoundTrip(), roundTrip > 0 else {
            longPath = false
            return nil
        }
        var pause = min(roundTrip / Self.roundTripDivisor, Self.maximumPauseNanoseconds)
        longPath = pause >= Self.minimumPauseNanoseconds
        guard longPath else { return nil }
        if pause > Self.fastPathPauseNanoseconds {
            // Past 1 ms only as long as a full read took to arrive, at the rate the datagrams of
            // the last pause came (none: longer than any pause); not known yet: 1 ms.
            var fullRead = Self.fastPathPauseNanoseconds
            if let pausedBefore {
                fullRead = read == 0 ? pause : pausedBefore * Int64(busyReadMessages) / Int64(read)  // ≤ 4 ms × limit
            }
            pause = min(pause, max(Self.fastPathPauseNanoseconds, fullRead))
        }
        lastPause = pause
        return pause
    }
}
