import NIOCore

/// One TCP connection to the relay: its first message says whether it is a control connection
/// (`hello`) or a splice (`splice`); a control connection's messages go to the room table, a
/// splice's bytes, once matched, to its partner — read only as fast as the partner takes them.
final class RelayConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private enum State {
        /// The first message's bytes so far (one message at most, then the rest is kept).
        case first(ByteBuffer)
        /// After `hello`: messages.
        case control(RelayMessageDecoder)
        /// After `splice`, until the partner comes: what followed the message, unread further.
        case awaitingPartner(held: ByteBuffer)
        case spliced
        case closing
    }

    private let core: RelayCore
    private var state: State = .first(ByteBuffer())
    private var id: RelayConnectionID?
    private var context: ChannelHandlerContext?
    private var partner: RelayConnectionHandler?
    /// Bytes were written to the partner and await a flush at the end of this read.
    private var partnerNeedsFlush = false
    /// Reading stopped: the partner's send buffer is full.
    private var waitingForPartner = false
    /// Reading stopped: this address's byte allowance is spent.
    private var waitingForAllowance = false
    /// The peer half-closed before the partner came; passed on once it has.
    private var inputEnded = false
    private var closeRequested = false

    init(core: RelayCore) {
        self.core = core
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        guard let remote = context.remoteAddress, let address = ClientAddress(remote) else {
            context.close(promise: nil)
            return
        }
        switch core.admit(self, from: address) {
        case .success(let id):
            self.id = id
        case .failure(let refusal):
            send(.refused(reason: refusal.reason))
            closeAfterWrites()
        }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard let id else { return }
        switch state {
        case .first(var pending):
            state = .closing  // while `pending` is held here, not in the enum (no copy on write)
            pending.writeBuffer(&buffer)
            readFirstMessage(from: &pending, on: id)
        case .control(var decoder):
            state = .closing
            readMessages(from: buffer.readableBytesView, decoder: &decoder, on: id)
        case .awaitingPartner(var held):
            // A read already under way when reading stopped: kept, bounded by one read.
            state = .closing
            held.writeBuffer(&buffer)
            state = .awaitingPartner(held: held)
        case .spliced:
            relay(buffer, on: id)
        case .closing:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if partnerNeedsFlush {
            partnerNeedsFlush = false
            partner?.context?.flush()
        }
        core.publishStatistics()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable, let partner, partner.waitingForPartner {
            partner.waitingForPartner = false
            partner.updateReading()
        }
        context.fireChannelWritabilityChanged()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let event = event as? ChannelEvent, event == .inputClosed else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        switch state {
        case .spliced:
            // The end of this side's data becomes the end of what the partner is sent.
            partner?.shutdownOutputAfterWrites()
        case .awaitingPartner:
            inputEnded = true
        case .first, .control, .closing:
            // A control connection that stops sending has left.
            closeAfterWrites()
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        state = .closing
        if let id {
            self.id = nil
            core.closed(id)
        }
        if let partner {
            self.partner = nil
            partner.partner = nil
            partner.closeAfterWrites()
        }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A reset or a failed write: the connection is done; channelInactive tidies up.
        context.close(promise: nil)
    }

    // MARK: Messages

    private func readFirstMessage(from pending: inout ByteBuffer, on id: RelayConnectionID) {
        guard let length = pending.getInteger(at: pending.readerIndex, as: UInt32.self) else {
            state = .first(pending)
            return
        }
        guard length <= RelayMessage.maximumSize else {
            core.violation(on: id, "a message of \(length) bytes is over the \(RelayMessage.maximumSize)-byte limit")
            return
        }
        guard let frame = pending.readSlice(length: 4 + Int(length)) else {
            state = .first(pending)
            return
        }
        // Only the first frame is decoded here: after a splice message come the client's own
        // bytes (a TLS ClientHello, say), which are no relay messages.
        var decoder = RelayMessageDecoder()
        let message: RelayMessage
        do {
            guard let first = try decoder.feed(frame.readableBytesView).first else { return }
            message = first
        } catch {
            core.violation(on: id, (error as? RelayWireError)?.description ?? "a message that does not decode")
            return
        }
        if case .splice = message {
            // Nothing more is read until the partner comes: what the client sent on is held.
            state = .awaitingPartner(held: pending)
            stopReading()
            core.received(message, on: id)
            return
        }
        state = .control(decoder)
        core.received(message, on: id)
        guard case .control(var decoder) = state, pending.readableBytes > 0 else { return }
        state = .closing
        readMessages(from: pending.readableBytesView, decoder: &decoder, on: id)
    }

    private func readMessages(from bytes: ByteBufferView, decoder: inout RelayMessageDecoder, on id: RelayConnectionID) {
        let messages: [RelayMessage]
        do {
            messages = try decoder.feed(bytes)
        } catch {
            core.violation(on: id, (error as? RelayWireError)?.description ?? "a message that does not decode")
            return
        }
        state = .control(decoder)
        for message in messages {
            guard case .control = state, !closeRequested else { return }
            core.received(message, on: id)
        }
    }

    /// Writes a message at once.
    func send(_ message: RelayMessage) {
        guard let context, let bytes = try? message.framed() else { return }
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: bytes)), promise: nil)
    }

    // MARK: Splice

    func startSplice(with partner: RelayConnectionHandler) {
        guard case .awaitingPartner(let held) = state else { return }
        self.partner = partner
        state = .spliced
        if held.readableBytes > 0, let id {
            relay(held, on: id)
            partnerNeedsFlush = false
            partner.context?.flush()
        }
        if inputEnded {
            partner.shutdownOutputAfterWrites()
        } else {
            updateReading()
        }
    }

    private func relay(_ buffer: ByteBuffer, on id: RelayConnectionID) {
        guard let partnerContext = partner?.context else { return }
        let count = buffer.readableBytes
        partnerContext.write(wrapOutboundOut(buffer), promise: nil)
        partnerNeedsFlush = true
        if let wait = core.rooms.spliceRelayed(count, on: id, now: .now) {
            pauseForAllowance(wait)
        }
        if !partnerContext.channel.isWritable {
            waitingForPartner = true
            updateReading()
        }
    }

    private func pauseForAllowance(_ wait: Duration) {
        guard !waitingForAllowance, let context else { return }
        waitingForAllowance = true
        updateReading()
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let nanoseconds = wait.components.seconds &* 1_000_000_000 &+ wait.components.attoseconds / 1_000_000_000
        context.eventLoop.scheduleTask(in: .nanoseconds(max(nanoseconds, 1_000_000))) {
            handler.value.waitingForAllowance = false
            handler.value.updateReading()
        }
    }

    /// Reads while spliced and neither the partner nor the allowance holds it back.
    private func updateReading() {
        guard case .spliced = state, let context else { return }
        let reading = !waitingForPartner && !waitingForAllowance
        try? context.channel.syncOptions?.setOption(.autoRead, value: reading)
        if reading { context.read() }
    }

    private func stopReading() {
        try? context?.channel.syncOptions?.setOption(.autoRead, value: false)
    }

    // MARK: Closing

    /// Closes once what was written has left (an empty write completes after those before it).
    func closeAfterWrites() {
        guard !closeRequested, let channel = context?.channel else { return }
        closeRequested = true
        if case .spliced = state {} else { state = .closing }
        channel.writeAndFlush(ByteBuffer()).whenComplete { _ in channel.close(promise: nil) }
    }

    /// Sends FIN once what was written has left, keeping the other direction open. (NIO's own
    /// output close drops what is unwritten when the input has already ended.)
    func shutdownOutputAfterWrites() {
        guard !closeRequested, let channel = context?.channel else { return }
        channel.writeAndFlush(ByteBuffer()).whenComplete { _ in channel.close(mode: .output, promise: nil) }
    }

    func closeNow() {
        closeRequested = true
        context?.close(promise: nil)
    }
}

@available(*, unavailable)
extension RelayConnectionHandler: Sendable {}

/// The relay's UDP socket: `bind` answered with `bound`, `data` from a bound seat forwarded as
/// it is to its peer's bound address, anything else dropped after one hash lookup. Writes are
/// flushed once per read batch (one `sendmmsg`), never queued past the socket's watermark.
final class RelayDatagramHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    typealias OutboundOut = AddressedEnvelope<ByteBuffer>

    private let core: RelayCore
    private var needsFlush = false
    private var socketIsIPv6 = true
    /// Datagrams to one peer, of one size, gathered into one GSO send.
    private var batch: Batch?

    private struct Batch {
        let target: ClientAddress
        let address: SocketAddress
        var buffer: ByteBuffer
        let segmentSize: Int
        var count: Int
        /// A shorter datagram ended it (GSO: only the last segment may be shorter).
        var ended: Bool
    }

    /// The most datagrams, and bytes, one GSO send carries (the kernel's limits: 64 segments,
    /// a UDP datagram's 65 507 bytes).
    static let maximumSegments = 64
    static let maximumBatchBytes = 65_000

    init(core: RelayCore) {
        self.core = core
    }

    func channelActive(context: ChannelHandlerContext) {
        socketIsIPv6 = context.localAddress?.protocol == .inet6
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        let payload = envelope.data
        guard let type = payload.getInteger(at: payload.readerIndex, as: UInt8.self),
              let source = ClientAddress(envelope.remoteAddress) else {
            core.rooms.dropped()
            return
        }
        if let segmentSize = envelope.metadata?.segmentSize, segmentSize > 0, segmentSize < payload.readableBytes {
            forwardBatch(payload, segmentSize: segmentSize, from: source, remote: envelope.remoteAddress, context: context)
            return
        }
        switch type {
        case RelayDatagram.dataType:
            // Checked first: a datagram that cannot leave now is dropped, never queued.
            guard context.channel.isWritable else {
                core.rooms.dropped()
                return
            }
            forward(payload, from: source, context: context)
        case RelayDatagram.bindType:
            guard payload.readableBytes == 1 + RelayMessage.tokenSize,
                  let token = payload.getBytes(at: payload.readerIndex + 1, length: RelayMessage.tokenSize) else {
                core.rooms.dropped()
                return
            }
            guard core.rooms.bind(token: token, from: source, now: .now) else { return }
            flushBatch(context: context)
            let bound = RelayDatagram.bound(source.datagramAddress).encoded
            context.write(wrapOutboundOut(AddressedEnvelope(remoteAddress: envelope.remoteAddress, data: context.channel.allocator.buffer(bytes: bound))), promise: nil)
            needsFlush = true
        default:
            core.rooms.dropped()
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        flushBatch(context: context)
        if needsFlush {
            needsFlush = false
            context.flush()
        }
        core.publishStatistics()
    }

    /// One datagram to its peer seat, as it came: added to the batch for that peer when it
    /// fits (same size, or shorter to end it), else after the batch before it is written.
    /// Datagrams read in one `recvmmsg` from one seat then leave in one GSO send, which costs
    /// the kernel (and the relay) a fraction of a `sendmmsg` of each (docs/RELAY.md, "Cost").
    private func forward(_ payload: ByteBuffer, from source: ClientAddress, context: ChannelHandlerContext) {
        guard let target = core.rooms.forwardingTarget(from: source, byteCount: payload.readableBytes, now: .now),
              let address = target.socketAddress(fromIPv6Socket: socketIsIPv6) else { return }
        let size = payload.readableBytes
        if core.datagramBatching, var pending = batch, pending.target == target, !pending.ended,
           pending.count < Self.maximumSegments, size > 0, size <= pending.segmentSize,
           pending.buffer.readableBytes + size <= Self.maximumBatchBytes {
            batch = nil  // held here while it grows, so the buffer is not copied on write
            if pending.count == 1 {
                // The first datagram is a slice of the read buffer: the batch gets its own.
                var own = context.channel.allocator.buffer(capacity: Self.maximumBatchBytes)
                own.writeImmutableBuffer(pending.buffer)
                pending.buffer = own
            }
            pending.buffer.writeImmutableBuffer(payload)
            pending.count += 1
            pending.ended = size < pending.segmentSize
            batch = pending
            return
        }
        flushBatch(context: context)
        batch = Batch(target: target, address: address, buffer: payload, segmentSize: size, count: 1, ended: false)
    }

    private func flushBatch(context: ChannelHandlerContext) {
        guard let pending = batch else { return }
        batch = nil
        needsFlush = true
        guard pending.count > 1 else {
            context.write(wrapOutboundOut(AddressedEnvelope(remoteAddress: pending.address, data: pending.buffer)), promise: nil)
            return
        }
        writeSegments(pending.buffer, segmentSize: pending.segmentSize, to: pending.address, context: context)
    }

    /// A GSO send. Where the kernel refuses them (EIO: an interface without checksum offload,
    /// an IPsec path), NIO closes the socket; the relay opens it again and sends each datagram
    /// alone from then on.
    private func writeSegments(_ buffer: ByteBuffer, segmentSize: Int, to address: SocketAddress, context: ChannelHandlerContext) {
        let metadata = AddressedEnvelope<ByteBuffer>.Metadata(ecnState: .transportNotCapable, packetInfo: nil, segmentSize: segmentSize)
        let promise = context.eventLoop.makePromise(of: Void.self)
        let core = NIOLoopBound(core, eventLoop: context.eventLoop)
        promise.futureResult.whenFailure { _ in core.value.datagramBatching = false }
        context.write(wrapOutboundOut(AddressedEnvelope(remoteAddress: address, data: buffer, metadata: metadata)), promise: promise)
        needsFlush = true
    }

    /// Datagrams the kernel coalesced (UDP GRO: one sender's burst, equal sizes but the last)
    /// go on as one GSO send of the same segments, without being split: a QUIC sender's
    /// batches then cost the relay a system call per batch, not per packet. A batch holding
    /// anything but `data` (a bind, a stray type) is taken apart and each datagram handled alone.
    private func forwardBatch(_ payload: ByteBuffer, segmentSize: Int, from source: ClientAddress, remote: SocketAddress, context: ChannelHandlerContext) {
        var offset = payload.readerIndex
        var allData = true
        while offset < payload.writerIndex {
            if payload.getInteger(at: offset, as: UInt8.self) != RelayDatagram.dataType { allData = false }
            offset += segmentSize
        }
        guard allData, core.datagramBatching else {
            var rest = payload
            while let segment = rest.readSlice(length: min(segmentSize, rest.readableBytes)), segment.readableBytes > 0 {
                channelRead(context: context, data: NIOAny(AddressedEnvelope(remoteAddress: remote, data: segment)))
            }
            return
        }
        let datagrams = (payload.readableBytes + segmentSize - 1) / segmentSize
        guard context.channel.isWritable else {
            for _ in 0..<datagrams { core.rooms.dropped() }
            return
        }
        guard let target = core.rooms.forwardingTarget(from: source, byteCount: payload.readableBytes, datagrams: datagrams, now: .now),
              let address = target.socketAddress(fromIPv6Socket: socketIsIPv6) else { return }
        flushBatch(context: context)
        writeSegments(payload, segmentSize: segmentSize, to: address, context: context)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A send refused (ICMP unreachable reported back, a full queue): one datagram lost, as
        // the network would lose it. The socket stays open.
    }
}

@available(*, unavailable)
extension RelayDatagramHandler: Sendable {}
