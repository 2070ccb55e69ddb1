import NIOCore
@_spi(Stacks) import QXferCore

/// Hands bytes from a NIO pipeline to one async reader, with backpressure.
///
/// Reads from the socket stop while more than `highWatermark` bytes wait for the reader,
/// and resume once it has taken them, so a slow reader slows the sender through TCP flow
/// control instead of growing a buffer. All state lives on the channel's event loop.
final class InboundBridge: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let highWatermark: Int
    /// Small slices copied into buffers of the bridge's own (see `appendCompactly`), which also
    /// gives NIOSSL its read buffer back at once instead of making it allocate another.
    private var queue = CircularBuffer<ByteBuffer>()
    private var lastIsOwn = false
    private var queuedBytes = 0
    private var readHeldBack = false
    private var end: Result<Void, any Error>?
    private var waiter: EventLoopPromise<[ByteBuffer]?>?
    private var context: ChannelHandlerContext?
    /// Set when the bridge closes the channel itself (idle timeout), so readers and writers
    /// report why.
    private(set) var closeReason: QXferError?
    /// The first error the pipeline reported (a TLS alert from the peer, typically): more
    /// telling than the "channel closed" a concurrent write sees.
    private(set) var firstError: (any Error)?
    /// Whether the peer finished sending or the channel closed.
    var hasEnded: Bool { end != nil }

    init(highWatermark: Int = 1 << 20) {
        self.highWatermark = highWatermark
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

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
        queue.appendCompactly(buffer, lastIsOwn: &lastIsOwn)
        deliver()
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
        if sink == nil && queuedBytes >= highWatermark {
            readHeldBack = true
        } else {
            context.read()
        }
    }

    /// Everything queued, or nil at the end of the stream; waits for data when none is queued.
    func next(on eventLoop: any EventLoop) -> EventLoopFuture<[ByteBuffer]?> {
        if !queue.isEmpty { return eventLoop.makeSucceededFuture(drain()) }
        switch end {
        case .success?: return eventLoop.makeSucceededFuture(nil)
        case .failure(let error)?: return eventLoop.makeFailedFuture(error)
        case nil:
            precondition(waiter == nil, "one reader at a time")
            let promise = eventLoop.makePromise(of: [ByteBuffer]?.self)
            waiter = promise
            return promise.futureResult
        }
    }

    /// Puts back bytes a reader took ahead of its need (the answer to a TLS child connection's
    /// hello, with whatever followed it): the next read returns them first.
    func pushBack(_ buffers: [ByteBuffer]) {
        for buffer in buffers.reversed() where buffer.readableBytes > 0 {
            queue.prepend(buffer)
            queuedBytes += buffer.readableBytes
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
        if end != nil {
            sink(nil)
            return
        }
        self.sink = sink
        if readHeldBack, let context {
            readHeldBack = false
            context.read()
        }
    }

    private func drain() -> [ByteBuffer] {
        let buffers = Array(queue)
        queue.removeAll(keepingCapacity: true)
        lastIsOwn = false
        queuedBytes = 0
        if readHeldBack, let context {
            readHeldBack = false
            context.read()
        }
        return buffers
    }

    private func deliver() {
        guard let waiter else { return }
        self.waiter = nil
        if !queue.isEmpty {
            waiter.succeed(drain())
        } else if case .failure(let error)? = end {
            waiter.fail(error)
        } else {
            waiter.succeed(nil)
        }
    }

    private func finish(_ result: Result<Void, any Error>) {
        if end == nil {
            end = result
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
