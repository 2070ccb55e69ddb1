import NIOCore
@_spi(Stacks) import QXferCore

/// Hands bytes from a NIO pipeline to one async reader, with backpressure.
///
/// Reads from the socket stop while more than `highWatermark` bytes wait for the reader,
/// and resume once it has taken them, so a slow reader slows the sender through TCP flow
/// control instead of growing a buffer. A listener's bridges share a ``ReadAheadBudget``: one
/// without a share of it holds at most ``floor`` bytes, counting those its reader took beyond
/// what it asked for, unless its waiting reader needs more. A reader that needs a whole message
/// is woken once it has arrived, not for every socket read, and the socket's wake mark spares the
/// event loop most wake-ups in between (``SocketWakeMark``). All state lives on the channel's
/// event loop.
final class InboundBridge: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let highWatermark: Int
    /// What a bridge of a listener holds without a share of its budget.
    static let floor = 64 << 10
    private let budget: ReadAheadBudget?
    /// The share of `budget` held: 0, or ``shareSize``, which lets the bridge read ahead as one
    /// without a budget does.
    private var share = 0
    private var shareSize: Int { 2 * highWatermark }
    /// What the reader took beyond what it asked for at its last read (what followed a
    /// message's header, typically): it still holds those bytes until it asks again.
    private var handedAhead = 0
    /// Small slices copied into buffers of the bridge's own (see `appendCompactly`), which also
    /// gives NIOSSL its read buffer back at once instead of making it allocate another.
    private var queue = CircularBuffer<ByteBuffer>()
    private var lastIsOwn = false
    private var queuedBytes = 0
    private var readHeldBack = false
    private var end: Result<Void, any Error>?
    private var waiter: EventLoopPromise<[ByteBuffer]?>?
    /// Bytes the waiting reader needs before it can go on.
    private var waiterNeeds = 1
    /// Set while the bridge is in a pipeline.
    private var wakeMark: SocketWakeMark?
    private var context: ChannelHandlerContext?
    /// Set when the bridge closes the channel itself (idle timeout), so readers and writers
    /// report why.
    private(set) var closeReason: QXferError?
    /// The first error the pipeline reported (a TLS alert from the peer, typically): more
    /// telling than the "channel closed" a concurrent write sees.
    private(set) var firstError: (any Error)?
    /// Whether the peer finished sending or the channel closed.
    var hasEnded: Bool { end != nil }

    /// `budget`: the listener's, shared by its connections; nil reads ahead up to `highWatermark`.
    init(highWatermark: Int = 1 << 20, budget: ReadAheadBudget? = nil) {
        self.highWatermark = highWatermark
        self.budget = budget
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        wakeMark = SocketWakeMark(socket: ChannelSocket(channel: context.channel), eventLoop: context.eventLoop)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        releaseShare()
        wakeMark?.drop()
        wakeMark = nil
        self.context = nil
    }

    /// Sets wake marks on `socket` instead of the channel's (a test's recorder).
    func setWakeMarks(on socket: any WakeMarkSocket) {
        guard let context else { return }
        wakeMark = SocketWakeMark(socket: socket, eventLoop: context.eventLoop)
    }

    /// Set once the bytes go to a handler of their own (a TLS child connection's datagrams)
    /// instead of an async reader.
    private var sink: ((ByteBuffer?) -> Void)?
    /// Told once when the peer's bytes end, however they end.
    private var endObservers: [() -> Void] = []

    /// Calls `observer` once the peer's bytes have ended (at once if they already have).
    func whenEnded(_ observer: @escaping () -> Void) {
        if end != nil { observer() } else { endObservers.append(observer) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        guard buffer.readableBytes > 0 else { return }
        if let sink {
            sink(buffer)
            return
        }
        queuedBytes += buffer.readableBytes
        // Reads are small then (`useSmallReads`): copied, their records leave NIOSSL's read
        // buffer free for the next read instead of making it allocate another.
        queue.appendCompactly(buffer, lastIsOwn: &lastIsOwn, copyingAll: readsAreSmall)
        deliver()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        updateWakeMark()
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(.success(()))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if firstError == nil { firstError = error }
        finish(.failure(error))
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event as? IdleStateHandler.IdleStateEvent == .all {
            closeReason = QXferError(.idleTimeout, "the connection was idle for too long and was closed")
            finish(.failure(closeReason!))
            context.close(promise: nil)
            return
        }
        if case .some(.inputClosed) = event as? ChannelEvent {
            finish(.success(()))
        }
        context.fireUserInboundEventTriggered(event)
    }

    func read(context: ChannelHandlerContext) {
        if mayRead() {
            context.read()
        } else {
            readHeldBack = true
        }
    }

    /// Whether the bridge may read from the socket now, taking a share of the budget if it
    /// needs one and one is left.
    private func mayRead() -> Bool {
        guard sink == nil else { return true }
        guard let budget, share == 0 else { return queuedBytes < highWatermark }
        let waiting = waiter != nil && queuedBytes < waiterNeeds
        // Past the floor, or for a reader that needs more than it, a share reads as a bridge
        // without a budget does.
        if held >= Self.floor || (waiting && waiterNeeds > Self.floor), budget.reserve(shareSize) {
            share = shareSize
            useSmallReads(false)
            return queuedBytes < highWatermark
        }
        useSmallReads(true)
        return held < Self.floor || waiting
    }

    /// How the socket is read: as NIO does at first, small (``smallRead``) once the bridge has no
    /// share to read with, and as NIO does for good once it first takes one.
    private enum Reads { case asNIO, small, asNIOForGood }

    private var reads = Reads.asNIO
    private var readsAreSmall: Bool { reads == .small }

    /// A bridge without a share reads less than a TLS record's ciphertext per read event, and
    /// copies what it gets. NIOSSL decrypts everything a read event brings into one buffer it
    /// keeps, grown to fit (it wants room for a whole record before each record) and allocated
    /// again while a slice of it waits here: with NIO's default (up to four reads of up to 64
    /// KiB), 450 connections whose messages waited took `qxfer recv` to 318-346 MiB, now
    /// 277-313. With less than a record per read, one record at most completes, and NIOSSL's
    /// buffer stays at 32 KiB.
    /// Once a share was taken, reads stay as NIO makes them: NIOSSL's buffer and NIO's read
    /// buffers have grown then, and switching back at every message would only add work.
    private func useSmallReads(_ small: Bool) {
        let next: Reads = small ? .small : .asNIOForGood
        guard reads != .asNIOForGood, reads != next else { return }
        let wasSmall = readsAreSmall
        reads = next
        guard small || wasSmall, let options = context?.channel.syncOptions else { return }
        if small {
            try? options.setOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: Self.smallRead))
            try? options.setOption(.maxMessagesPerRead, value: 1)
        } else {
            // NIO's defaults for a socket (an EmbeddedChannel traps on getOption, so they are
            // not read back).
            try? options.setOption(.recvAllocator, value: AdaptiveRecvByteBufferAllocator())
            try? options.setOption(.maxMessagesPerRead, value: Self.defaultReadsPerEvent)
        }
    }

    /// Half a full TLS record (RFC 8446 section 5.2); a power of two, as NIO rounds a read
    /// buffer up to one.
    static let smallRead = 8 << 10
    /// NIO's default reads per read event for a socket.
    private static let defaultReadsPerEvent: UInt = 4

    /// Resumes reads held back if the bridge may read again.
    private func resumeReading() {
        guard readHeldBack, let context, mayRead() else { return }
        readHeldBack = false
        context.read()
    }

    /// Bytes read that the reader has not used yet, as far as the bridge knows.
    private var held: Int { queuedBytes + handedAhead }

    /// Gives the budget's share back once the bridge holds less than the floor again.
    private func releaseShareIfUnneeded() {
        if held < Self.floor { releaseShare() }
    }

    private func releaseShare() {
        guard share > 0 else { return }
        budget?.release(share)
        share = 0
    }

    /// Everything queued once at least `minimum` bytes are (or as many as the high watermark
    /// lets wait), or what is left at the end of the stream, or nil after it.
    func next(atLeast minimum: Int = 1, on eventLoop: any EventLoop) -> EventLoopFuture<[ByteBuffer]?> {
        handedAhead = 0  // the reader is back: what it took ahead is used, or part of what it needs
        let needs = max(1, min(minimum, highWatermark))
        if queuedBytes >= needs || (end != nil && !queue.isEmpty) { return eventLoop.makeSucceededFuture(drain(needs: needs)) }
        switch end {
        case .success?: return eventLoop.makeSucceededFuture(nil)
        case .failure(let error)?: return eventLoop.makeFailedFuture(error)
        case nil:
            precondition(waiter == nil, "one reader at a time")
            let promise = eventLoop.makePromise(of: [ByteBuffer]?.self)
            waiter = promise
            waiterNeeds = needs
            releaseShareIfUnneeded()
            resumeReading()
            updateWakeMark()
            return promise.futureResult
        }
    }

    /// Puts back bytes a reader took ahead of its need (the answer to a TLS child connection's
    /// hello, with whatever followed it): the next read returns them first.
    func pushBack(_ buffers: [ByteBuffer]) {
        for buffer in buffers.reversed() where buffer.readableBytes > 0 {
            queue.prepend(buffer)
            queuedBytes += buffer.readableBytes
            handedAhead = max(0, handedAhead - buffer.readableBytes)
        }
    }

    /// From now on hands every buffer to `sink` as it arrives, and nil at the end of the stream,
    /// instead of queueing for a reader; what was queued goes first. Reads are never held back
    /// then: the sink keeps (or drops) what it gets.
    func redirect(to sink: @escaping (ByteBuffer?) -> Void) {
        precondition(waiter == nil, "redirecting a bridge that has a reader")
        for buffer in queue { sink(buffer) }
        queue.removeAll()
        lastIsOwn = false
        queuedBytes = 0
        handedAhead = 0
        releaseShare()
        if end != nil {
            sink(nil)
            return
        }
        self.sink = sink
        wakeMark?.drop()
        resumeReading()
    }

    /// Everything queued, for a reader that asked for `needs` bytes.
    private func drain(needs: Int) -> [ByteBuffer] {
        let buffers = Array(queue)
        queue.removeAll(keepingCapacity: true)
        lastIsOwn = false
        handedAhead = max(0, queuedBytes - needs)
        queuedBytes = 0
        releaseShareIfUnneeded()
        resumeReading()
        return buffers
    }

    private func deliver() {
        guard let waiter, queuedBytes >= waiterNeeds || end != nil else { return }
        self.waiter = nil
        if !queue.isEmpty {
            waiter.succeed(drain(needs: waiterNeeds))
        } else if case .failure(let error)? = end {
            waiter.fail(error)
        } else {
            waiter.succeed(nil)
        }
    }

    /// Raises the socket's wake mark to what the waiting reader still misses, or drops it. While
    /// no reader waits (it is busy with the last message), the mark stays: bytes that arrive
    /// meanwhile wait in the socket, and its next wish sets the mark again.
    private func updateWakeMark() {
        guard sink == nil, end == nil, waiter != nil else { return }
        wakeMark?.update(missing: waiterNeeds - queuedBytes) { [self] in wakeMark?.drop() }
    }

    private func finish(_ result: Result<Void, any Error>) {
        if end == nil {
            end = result
            wakeMark?.drop()
            let observers = endObservers
            endObservers = []
            for observer in observers { observer() }
            if let sink {
                self.sink = nil
                sink(nil)
            }
        }
        deliver()
    }
}
