import Logging
import NIOCore
import QUICEngine
@_spi(Stacks) import QXferCore
@_spi(Stacks) import QXferIdentity

/// Drives one ``QUICConnection`` engine on a NIO event loop: feeds it datagrams and timer
/// expiries, sends what it produces, and bridges its streams to async readers and writers.
///
/// Confined to its event loop; tasks reach it through `eventLoop.submit`/`flatSubmit`.
/// Engine calls only happen here, never from inside an engine callback.
final class QUICConnectionDriver: QUICEndpointConnection {
    private static let logger = Logger(label: "qxfer.quic")
    let engine: QUICConnection
    let eventLoop: any EventLoop
    let verifier: PeerVerifier
    let acceptedProtocols: [String]
    /// The endpoint (UDP socket) this connection sends through; nil while it has none. Weak:
    /// the socket's pipeline owns its endpoint, which keeps this driver.
    weak var endpoint: QUICSocketHandler?
    /// What its sockets are asked for (DSCP, read coalescing), so a socket it migrates to is the same.
    var socketOptions = QUICSockets.Options()
    /// A client's report that the server is there: called once, for the first datagram the
    /// engine accepts (an Initial, a Retry or a version negotiation), long before the handshake
    /// completes on a slow path.
    var peerAnswered: (@Sendable () -> Void)?
    /// Whether the engine has accepted any datagram from the peer.
    private(set) var heardFromPeer = false
    /// Set on a client whose first stream was handed over before its handshake (0-RTT): a
    /// failure to connect then says so (``EarlyDataUnanswered``).
    var earlyTo: Endpoint?

    private(set) var handshake: EventLoopPromise<String>
    /// On a server, completed when the client opens its first bidirectional stream.
    private let primary: EventLoopPromise<QUICStreamID>
    private(set) var closeError: QXferError?
    private var timer: Scheduled<Void>?
    private var timerDeadline: QUICTime?
    private var streams: [QUICStreamID: StreamState] = [:]
    private var incomingStreams = CircularBuffer<QUICStreamID>()
    private var incomingStreamWaiters = CircularBuffer<EventLoopPromise<QUICStreamID?>>()
    private var terminated = false
    private var incomingDatagrams = CircularBuffer<[UInt8]>()
    private var datagramWaiter: EventLoopPromise<[UInt8]?>?
    private var streamsAvailableWaiters = CircularBuffer<EventLoopPromise<Void>>()
    /// Received datagrams kept for a slow reader; older ones are dropped beyond this.
    static let incomingDatagramLimit = 256

    struct StreamState {
        var readWaiter: EventLoopPromise<[ByteBuffer]?>?
        /// What the waiting reader asked for at least, and what was read for it so far.
        var readMinimum = 1
        var gathered: [ByteBuffer] = []
        var gatheredBytes = 0
        var pendingWrites = CircularBuffer<(ByteBuffer, EventLoopPromise<Void>)>()
        var error: QXferError?
        /// The peer reset the stream and no reader has been told yet: the state outlives the
        /// engine's stream until one is (dropped, the next read would find a clean end).
        var resetUnreported = false
        /// The engine has closed the stream: once the reset is told, nothing needs the state.
        var closedInEngine = false
    }

    var handshakeResult: EventLoopFuture<String> { handshake.futureResult }

    init(engine: QUICConnection, eventLoop: any EventLoop, verifier: PeerVerifier, acceptedProtocols: [String]) {
        self.engine = engine
        self.eventLoop = eventLoop
        self.verifier = verifier
        self.acceptedProtocols = acceptedProtocols
        self.handshake = eventLoop.makePromise(of: String.self)
        self.primary = eventLoop.makePromise(of: QUICStreamID.self)
    }

    /// The connection's primary stream as the server sees it: stream 0, once the client uses it.
    var primaryStream: EventLoopFuture<QUICStreamID> { primary.futureResult }

    static var now: QUICTime { QUICClock.now }

    // MARK: Input

    /// Hands one received datagram to the engine; call ``process()`` after a batch.
    func receive(_ datagram: UnsafeRawBufferPointer, path: QUICPath, now: QUICTime) {
        guard !terminated else { return }
        do {
            try engine.handle(datagram: datagram, path: path, now: now)
            heardFromPeer = true
            if let answered = peerAnswered {
                peerAnswered = nil
                answered()
            }
        } catch {
            // The engine queued a close event too; process() reports it.
        }
    }

    /// Drains events, sends what is ready, and re-arms the timer. Call after every input.
    func process() {
        guard !terminated else { return }
        drainEvents()
        flushTransmits()
        closeWhenDelivered()
        armTimer()
        reportCloseSent()
    }

    // MARK: Streams and datagrams, for the async side (on the event loop)

    /// Opens a new bidirectional stream; nil while the peer's stream limit is reached.
    func openStream() throws -> QUICStreamID? {
        if let closeError { throw closeError }
        guard let id = try engine.openStream(bidirectional: true) else { return nil }
        streams[id] = StreamState()
        return id
    }

    /// Waits until the peer raises its stream limit (or the connection closes).
    func streamsAvailable() -> EventLoopFuture<Void> {
        if let closeError { return eventLoop.makeFailedFuture(closeError) }
        let promise = eventLoop.makePromise(of: Void.self)
        streamsAvailableWaiters.append(promise)
        return promise.futureResult
    }

    /// Abandons a stream in both directions (RESET_STREAM and STOP_SENDING).
    func reset(_ stream: QUICStreamID, errorCode: UInt64) {
        try? engine.reset(stream: stream, errorCode: errorCode)
        try? engine.stopSending(stream: stream, errorCode: errorCode)
        failStream(stream, QXferError(.cancelled, "the stream was reset"))
        if streams[stream]?.resetUnreported == true { streams[stream] = nil }  // given up unread
        process()
    }

    /// Queues one unreliable datagram.
    func sendDatagram(_ payload: ByteBuffer) throws {
        if let closeError { throw closeError }
        do {
            try engine.sendDatagram(Array(payload.readableBytesView))
        } catch {
            throw QXferError(.invalidUse, "cannot send a \(payload.readableBytes)-byte datagram: \(error)")
        }
        process()
    }

    /// The next received datagram; nil once the connection is closed.
    func receiveDatagram() -> EventLoopFuture<[UInt8]?> {
        if let datagram = incomingDatagrams.popFirst() { return eventLoop.makeSucceededFuture(datagram) }
        if closeError != nil { return eventLoop.makeSucceededFuture(nil) }
        precondition(datagramWaiter == nil, "one datagram reader at a time")
        let promise = eventLoop.makePromise(of: [UInt8]?.self)
        datagramWaiter = promise
        return promise.futureResult
    }

    /// The next stream the peer opened, other than the primary one; nil once the connection is closed.
    func acceptStream() -> EventLoopFuture<QUICStreamID?> {
        if let id = incomingStreams.popFirst() { return eventLoop.makeSucceededFuture(id) }
        if closeError != nil { return eventLoop.makeSucceededFuture(nil) }
        let promise = eventLoop.makePromise(of: QUICStreamID?.self)
        incomingStreamWaiters.append(promise)
        return promise.futureResult
    }

    /// Writes all of `buffer` on the stream, completing once the engine has taken it (it keeps
    /// at most its send-buffer limit per stream, so this is where backpressure bites).
    func write(_ buffer: ByteBuffer, on stream: QUICStreamID) -> EventLoopFuture<Void> {
        if let error = closeError ?? streams[stream]?.error { return eventLoop.makeFailedFuture(error) }
        let promise = eventLoop.makePromise(of: Void.self)
        streams[stream, default: StreamState()].pendingWrites.append((buffer, promise))
        pumpWrites(stream)
        process()
        return promise.futureResult
    }

    /// Ends the sending side of the stream (FIN) after what was written.
    func finish(_ stream: QUICStreamID) -> EventLoopFuture<Void> {
        write(ByteBuffer(), on: stream).assumeIsolated().flatMapThrowing {
            try self.engine.finish(stream: stream)
            self.process()
        }.nonisolated()
    }

    /// What has arrived on the stream once it is `minimum` bytes (fewer if the stream ends or
    /// fails first); nil after the peer's FIN. The bytes are taken from the engine as they
    /// arrive, so flow control moves as it would with a reader waking for every packet.
    func read(_ stream: QUICStreamID, atLeast minimum: Int = 1) -> EventLoopFuture<[ByteBuffer]?> {
        precondition(streams[stream]?.readWaiter == nil, "one reader per stream")
        let promise = eventLoop.makePromise(of: [ByteBuffer]?.self)
        var state = streams[stream] ?? StreamState()
        state.readWaiter = promise
        state.readMinimum = max(minimum, 1)
        streams[stream] = state
        serveReader(stream)
        process()  // reading extended flow control: tell the peer
        return promise.futureResult
    }

    /// Closes the connection with an application error code (0: no error) at once; data
    /// the peer has not acknowledged is lost.
    func close(code: UInt64 = 0, reason: String = "") {
        guard !terminated else { return }
        closeDeadline = nil
        engine.close(errorCode: code, reason: reason, now: Self.now)
        process()
    }

    /// Closes the connection once every byte the application handed over has been
    /// acknowledged (or `timeout` passed), as closing a TCP socket lets the kernel deliver
    /// what it holds: a handler that sends its last reply and returns loses nothing.
    func closeGracefully(code: UInt64 = 0, reason: String = "", timeout: TimeAmount = .seconds(10)) {
        guard !terminated, closeError == nil, closeDeadline == nil else { return }
        closeCode = (code, reason)
        closeBy(.now() + timeout)
    }

    /// Completes once the close under way has left this process: the CONNECTION_CLOSE is
    /// handed to the socket (at `timeout` at the latest, delivered or not), or the peer closed
    /// first, or the connection ended otherwise; at once if no close is under way. A QUIC
    /// connection lives in its process, unlike TCP's in the kernel: a program that exits before
    /// this takes its close (and its last acknowledgements) with it, and the peer waits for its
    /// idle timeout.
    func whenCloseSent(within timeout: TimeAmount) -> EventLoopFuture<Void> {
        guard !terminated, closeError == nil, let current = closeDeadline else { return eventLoop.makeSucceededFuture(()) }
        let promise = eventLoop.makePromise(of: Void.self)
        closeSentWaiters.append(promise)
        let deadline = NIODeadline.now() + timeout
        if deadline < current { closeBy(deadline) }
        return promise.futureResult
    }

    private func closeBy(_ deadline: NIODeadline) {
        closeDeadline = deadline
        // A path gone quiet may not wake the driver before then (the next probe can be seconds later).
        eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [self] in process() }
        process()
    }

    private var closeDeadline: NIODeadline?
    private var closeCode: (UInt64, String) = (0, "")
    private var closeSentWaiters: [EventLoopPromise<Void>] = []

    private func closeWhenDelivered() {
        guard let deadline = closeDeadline, !terminated else { return }
        let unacknowledged = engine.openStreams.reduce(0) { $0 + engine.bufferedSendBytes(stream: $1) }
        if unacknowledged == 0 || closeError != nil || NIODeadline.now() >= deadline {
            close(code: closeCode.0, reason: closeCode.1)
        }
    }

    /// Tells those waiting for the close that it has left (called once the close is written).
    private func reportCloseSent() {
        guard !closeSentWaiters.isEmpty, terminated || closeError != nil else { return }
        let waiters = closeSentWaiters
        closeSentWaiters = []
        for waiter in waiters { waiter.succeed(()) }
    }

    // MARK: Engine events

    private func drainEvents() {
        while let event = engine.pollEvent() {
            switch event {
            case .handshakeCompleted(let alpn):
                if acceptedProtocols.contains(alpn) {
                    handshake.succeed(alpn)
                } else {
                    engine.close(errorCode: 0x178, reason: "no application protocol", now: Self.now)
                }
            case .streamOpened(let id):
                streams[id, default: StreamState()] = streams[id] ?? StreamState()
                if id.rawValue == 0 {
                    primary.succeed(id)  // the client's first bidirectional stream: the connection's own
                } else if let waiter = incomingStreamWaiters.popFirst() {
                    waiter.succeed(id)
                } else {
                    incomingStreams.append(id)
                }
            case .streamReadable(let id), .streamFinished(let id):
                serveReader(id)
            case .streamReset(let id, let code):
                streams[id]?.resetUnreported = true
                failStream(id, QXferError(.connectionClosed, "the peer abandoned the stream (error \(code))"))
            case .streamStopSending(let id, _):
                failStream(id, QXferError(.connectionClosed, "the peer stopped reading the stream"))
            case .streamWritable(let id):
                pumpWrites(id)
            case .streamClosed(let id, _):
                serveReader(id)
                if streams[id]?.resetUnreported == true {
                    streams[id]?.closedInEngine = true
                } else if streams[id]?.readWaiter == nil && streams[id]?.pendingWrites.isEmpty != false {
                    streams[id] = nil
                }
            case .connectionIDIssued(let id, _):
                endpoint?.route(id, to: self)
            case .connectionIDRetired(let id):
                endpoint?.unroute(id, from: self)
            case .connectionClosed(let reason):
                closed(with: QUICErrors.describe(reason, verifier: verifier, offered: acceptedProtocols))
            case .datagramReceived(let payload):
                if let waiter = datagramWaiter {
                    datagramWaiter = nil
                    waiter.succeed(payload)
                } else {
                    if incomingDatagrams.count >= Self.incomingDatagramLimit { incomingDatagrams.removeFirst() }
                    incomingDatagrams.append(payload)
                }
            case .streamsAvailable:
                while let waiter = streamsAvailableWaiters.popFirst() { waiter.succeed(()) }
            case .packetSizeLimited(let size?):
                Self.logger.info("QUIC packets above \(size) bytes stopped getting through to \(engine.path.remote): sending packets of \(size) bytes")
            case .packetSizeLimited(nil):
                Self.logger.info("trying full-size QUIC packets to \(engine.path.remote) again")
            case .pathChanged, .pathValidated:
                break
            }
        }
    }

    private static let allocator = ByteBufferAllocator()
    private static let maximumRead = 256 << 10

    private func serveReader(_ id: QUICStreamID) {
        // Taken out of the table while it is filled: a copy left there would share the
        // gathered buffer's storage, and every write into it would copy the whole buffer.
        guard streams[id]?.readWaiter != nil, var state = streams.removeValue(forKey: id),
              let waiter = state.readWaiter else { return }
        // The engine copies straight into the buffers handed to the reader, gathered until
        // the reader's minimum: one wake-up of the reader per message, not per packet (on a
        // path that delivers packets one at a time, a wake-up per 1.4 KB cost the receiver
        // more CPU than the packets). At most 256 KiB per buffer: a repaired loss can release a
        // whole window at once, and the reader's copy of it adds to the peak memory (the
        // window is already extended as the engine's queue drains); and the messages decoded
        // from a buffer keep all of its storage until each is handled, on every busy stream (a
        // receiver of many small files, 8 streams of Batches: 16 MiB of its peak heap with
        // buffers of up to 1 MiB, docs/benchmarks.md, "Send buffers shared by a connection's streams").
        var isFinished = false
        var forgotten = false
        while state.gatheredBytes < state.readMinimum {
            let available = engine.readableBytes(stream: id)
            // With nothing buffered, a failed stream reports its error (below); otherwise the
            // read only asks whether the peer's FIN has been reached.
            if available == 0 && (state.error ?? closeError) != nil { break }
            var buffer: ByteBuffer
            if available > 0, let last = state.gathered.last, last.writableBytes > 0 {
                buffer = state.gathered.removeLast()
            } else {
                let wanted = available == 0 ? 0 : max(state.readMinimum - state.gatheredBytes, available)
                buffer = Self.allocator.buffer(capacity: min(wanted, Self.maximumRead))
            }
            let capacity = min(available, buffer.writableBytes)
            let byteCount: Int
            do {
                byteCount = try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: capacity) { raw in
                    let read = try engine.read(stream: id, into: UnsafeMutableRawBufferPointer(rebasing: raw.prefix(capacity)))
                    isFinished = read.isFinished
                    return read.byteCount
                }
            } catch {
                forgotten = true  // the engine forgot the stream: both sides are done
                break
            }
            if buffer.readableBytes > 0 { state.gathered.append(buffer) }
            state.gatheredBytes += byteCount
            if isFinished || byteCount == 0 { break }
        }
        let failure = (isFinished || forgotten || engine.readableBytes(stream: id) > 0) ? nil : (state.error ?? closeError)
        guard state.gatheredBytes >= state.readMinimum || isFinished || forgotten || failure != nil else {
            streams[id] = state  // keep gathering
            return
        }
        let gathered = state.gathered
        state.readWaiter = nil
        state.gathered = []
        state.gatheredBytes = 0
        streams[id] = state
        if !gathered.isEmpty {
            waiter.succeed(gathered)  // an end or a failure is reported to the next read
        } else if let failure {
            if state.resetUnreported {
                state.resetUnreported = false
                streams[id] = state.closedInEngine ? nil : state
            }
            waiter.fail(failure)
        } else {
            waiter.succeed(nil)
        }
    }

    private func pumpWrites(_ id: QUICStreamID) {
        guard var state = streams[id] else { return }
        while case (var buffer, let promise)? = state.pendingWrites.first {
            if buffer.readableBytes == 0 {
                state.pendingWrites.removeFirst()
                promise.succeed(())
                continue
            }
            let accepted: Int
            do {
                accepted = try buffer.withUnsafeReadableBytes { try engine.write(stream: id, bytes: $0) }
            } catch where engine.isClosed {
                break  // the close's reason, drained next, fails the write: it says more than "closed"
            } catch {
                state.pendingWrites.removeFirst()
                promise.fail(QUICErrors.describe(error))
                continue
            }
            buffer.moveReaderIndex(forwardBy: accepted)
            if buffer.readableBytes == 0 {
                state.pendingWrites.removeFirst()
                promise.succeed(())
            } else {
                state.pendingWrites[state.pendingWrites.startIndex] = (buffer, promise)
                break  // wait for streamWritable
            }
        }
        streams[id] = state
    }

    private func failStream(_ id: QUICStreamID, _ error: QXferError) {
        guard var state = streams[id] else { return }
        state.error = error
        let writes = state.pendingWrites
        state.pendingWrites.removeAll()
        streams[id] = state
        for (_, promise) in writes { promise.fail(error) }
        serveReader(id)
    }

    private func closed(with error: QXferError) {
        guard closeError == nil else { return }
        var error = error
        if let earlyTo, !engine.isHandshakeComplete, error.code == .connectFailed {
            // Nothing sent early was accepted: the program may connect again at once (without it).
            error = QXferError(.connectFailed, error.message, underlying: EarlyDataUnanswered(endpoint: earlyTo, stack: "QUIC"))
        }
        closeError = error
        handshake.fail(error)
        primary.fail(error)
        for id in Array(streams.keys) { failStream(id, error) }
        while let waiter = incomingStreamWaiters.popFirst() { waiter.succeed(nil) }
        while let waiter = streamsAvailableWaiters.popFirst() { waiter.fail(error) }
        if let waiter = datagramWaiter {
            datagramWaiter = nil
            waiter.succeed(nil)
        }
    }

    // MARK: Output and timers

    private func flushTransmits() {
        while let endpoint, endpoint.sendNextBatch(of: engine) {}
        endpoint?.flushIfNeeded()
    }

    private func armTimer() {
        guard !engine.isTerminated, let next = engine.nextTimeout else {
            terminate()
            return
        }
        // A timer due no later than the new deadline stays: it fires, finds nothing due (or
        // less than it was set for) and re-arms. Rescheduling on every later deadline (the idle
        // and acknowledgement timers move with each batch of packets) cost a cancellation and
        // a new scheduled task per batch.
        if let current = timerDeadline, current <= next, timer != nil { return }
        timer?.cancel()
        timerDeadline = next
        timer = eventLoop.assumeIsolated().scheduleTask(deadline: .uptimeNanoseconds(next.nanoseconds)) { [self] in
            timerDeadline = nil
            timer = nil
            engine.handleTimeout(now: Self.now)
            process()
        }
    }

    private func terminate() {
        guard !terminated else { return }
        drainEvents()
        if closeError == nil { closed(with: QXferError(.connectionClosed, "the connection closed")) }
        terminated = true
        timer?.cancel()
        timer = nil
        for id in engine.sourceConnectionIDs { endpoint?.unroute(id, from: self) }
        endpoint?.forget(self)
        reportCloseSent()
    }

    /// Called by the socket when it closed: nothing can be sent any more.
    func socketClosed() {
        abandon(with: QXferError(.connectionClosed, "the connection's socket was closed"))
    }

    /// A client's handshake to a server whose host refuses UDP on its port (``UDPRefusalWatch``):
    /// ends now with `error`, unless the peer has answered: a refusal after that is stale or forged.
    func refused(with error: QXferError) {
        guard !heardFromPeer, !engine.isHandshakeComplete else { return }
        abandon(with: error)
    }

    /// Ends the connection without a word to the peer, which cannot hear it.
    private func abandon(with error: QXferError) {
        guard !terminated else { return }
        closed(with: error)
        terminated = true
        timer?.cancel()
        timer = nil
        endpoint?.forget(self)
        reportCloseSent()
    }

    func socketDied() {
        rebind()
    }

    /// Called by the socket when it died under the established connection: what is sent until a
    /// new socket is bound is lost (and recovered by QUIC, whose idle timeout still bounds the
    /// wait). The new socket takes the same local address, so the path does not change; if that
    /// address cannot be had, the connection migrates to a new port. Retried with backoff while
    /// binding fails.
    func rebind(after delay: TimeAmount = .milliseconds(100)) {
        endpoint = nil
        // Confined to the event loop, like everything here; the closures run on it.
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        let loop = eventLoop
        let options = socketOptions
        eventLoop.scheduleTask(in: delay) {
            let driver = bound.value
            guard !driver.terminated else { return }
            let host = QUICSockets.wildcardHost(ipv6: driver.engine.path.remote.isIPv6)
            let sameAddress = driver.engine.path.local.socketAddress.map {
                QUICSockets.bindClientSocket(on: loop, to: $0, options: options)
            } ?? loop.makeFailedFuture(QXferError(.invalidUse, "the connection has no local address"))
            sameAddress.flatMapError { _ in
                QUICSockets.bindClientSocket(on: loop, host: host, port: 0, options: options)
            }.whenComplete { result in
                let driver = bound.value
                switch result {
                case .success(let channel):
                    guard !driver.terminated, let handler = try? channel.pipeline.syncOperations.handler(type: QUICSocketHandler.self),
                          let newLocal = handler.localAddress else {
                        channel.close(promise: nil)
                        return
                    }
                    handler.attach(client: driver)
                    if newLocal != driver.engine.path.local {
                        try? driver.engine.migrate(toLocalAddress: newLocal, now: Self.now)
                    }
                    driver.process()
                case .failure:
                    driver.rebind(after: min(delay * 2, .seconds(1)))
                }
            }
        }
    }

    /// Called by the socket when its writes can go on after backpressure.
    func socketWritable() {
        process()
    }

    /// Path measurements from `ngtcp2_conn_get_conn_stat` and the engine's counters.
    var metrics: ConnectionMetrics {
        let stats = engine.stats
        var metrics = ConnectionMetrics()
        metrics.smoothedRTT = stats.smoothedRTT
        metrics.rttVariance = stats.rttVariance
        metrics.minimumRTT = stats.minRTT
        metrics.congestionWindow = Int(stats.congestionWindow)
        metrics.bytesInFlight = Int(stats.bytesInFlight)
        metrics.deliveryRate = Int(stats.deliveryRate)
        metrics.packetsLost = Int(stats.streamPacketsLost)
        metrics.bytesSent = Int(stats.bytesSent)
        metrics.bytesUnacknowledged = Int(clamping: stats.streamBytesUnacknowledged)
        metrics.bytesReceived = Int(stats.bytesReceived)
        return metrics
    }
}
