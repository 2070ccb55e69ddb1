import NIOCore

/// Two TCP channels of one event loop joined into a pipe: what one reads the other writes,
/// reading from one only while the other can take more (no queue grows past the write buffer's
/// high-water mark), a half-close passed on, a full close closing both.
enum SplicePipe {
    /// Joins `local` and `splice`, both with auto-read off, on the same loop (call there);
    /// `splice` may still have its ``SpliceHandshakeHandler``, whose held bytes go to `local` first.
    /// `counting` is told every byte read either way.
    static func join(_ local: any Channel, _ splice: any Channel, counting: @escaping (Int) -> Void) throws {
        local.eventLoop.preconditionInEventLoop()
        guard local.eventLoop === splice.eventLoop else { throw ReachError(.local, "a pipe's two channels must share one event loop") }
        let localEnd = PipeHandler(counting: counting)
        let spliceEnd = PipeHandler(counting: counting)
        localEnd.partner = spliceEnd
        spliceEnd.partner = localEnd
        try local.pipeline.syncOperations.addHandler(localEnd)
        try splice.pipeline.syncOperations.addHandler(spliceEnd)
        if let handshake = try? splice.pipeline.syncOperations.handler(type: SpliceHandshakeHandler.self),
           let context = try? splice.pipeline.syncOperations.context(handlerType: SpliceHandshakeHandler.self) {
            handshake.release(context: context)
        }
        // Reading starts here; from now on each end's `read` waits for its partner's room.
        for channel in [local, splice] {
            try channel.syncOptions?.setOption(.autoRead, value: true)
        }
        // A channel that closed before the join reports no close to its new handler.
        if !local.isActive || !splice.isActive {
            local.close(promise: nil)
            splice.close(promise: nil)
        }
    }

    /// The write buffer of a piped channel: enough for a fast path, bounded all the same.
    static let waterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 256 << 10, high: 1 << 20)
}

/// One end of a ``SplicePipe``.
final class PipeHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    fileprivate var partner: PipeHandler?
    private var context: ChannelHandlerContext?
    private var readWaiting = false
    private let counting: (Int) -> Void

    init(counting: @escaping (Int) -> Void) { self.counting = counting }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        try? context.channel.syncOptions?.setOption(.writeBufferWaterMark, value: SplicePipe.waterMark)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partner = nil
    }

    // MARK: inbound: what this end reads goes out of the partner

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        counting(buffer.readableBytes)
        partner?.partnerWrite(buffer)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        partner?.partnerFlush()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, case .inputClosed = event {
            partner?.partnerFinish()
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        let partner = self.partner
        self.partner = nil
        partner?.partnerClose()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { partner?.partnerCanTakeMore() }
        context.fireChannelWritabilityChanged()
    }

    // MARK: outbound: reading waits for the partner's room

    func read(context: ChannelHandlerContext) {
        if partner?.isWritable ?? false {
            context.read()
        } else {
            readWaiting = true
        }
    }

    // MARK: from the partner

    private var isWritable: Bool { context?.channel.isWritable ?? false }

    private func partnerWrite(_ buffer: ByteBuffer) {
        context?.write(wrapOutboundOut(buffer), promise: nil)
    }

    private func partnerFlush() { context?.flush() }

    private func partnerFinish() {
        context?.close(mode: .output, promise: nil)
    }

    private func partnerClose() {
        partner = nil
        context?.close(promise: nil)
    }

    private func partnerCanTakeMore() {
        guard readWaiting, let context else { return }
        readWaiting = false
        context.read()
    }
}
