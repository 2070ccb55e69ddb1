import FoundationEssentials
import Glibc
import NIOCore
import NIOFoundationEssentialsCompat

/// A connection to one peer, over the stack its declaration names.
///
/// ```swift
/// let connection = NetworkConnection(to: .hostPort(host: "office-pc.local", port: 4433)) { TLS() }
/// try await connection.send(Data("hello".utf8))
/// let reply = try await connection.receive(exactly: 5).content
/// ```
///
/// The connection starts on the first `send` or `receive` and closes when it is cancelled,
/// when an operation's task is cancelled, or when the last reference goes away; a connection
/// therefore lives in the task that uses it. One task may receive at a time; any number may send.
public final class NetworkConnection<Stack: NetworkProtocolStack>: Sendable {
    /// Where this connection goes (for accepted connections: where it came from, if known).
    public let endpoint: Endpoint?
    /// The stack and parameters it was created with.
    public let parameters: NetworkParameters<Stack>

    private let machine: Locked<Machine>
    let inbound = InboundBuffer()

    /// Creates a connection described by a stack declaration; nothing happens until first use.
    public convenience init(to endpoint: Endpoint, @NetworkStackBuilder _ stack: () -> Stack) {
        self.init(to: endpoint, using: .parameters(stack))
    }

    /// Creates a connection with explicit parameters; nothing happens until first use.
    public init(to endpoint: Endpoint, using parameters: NetworkParameters<Stack>) {
        self.endpoint = endpoint
        self.parameters = parameters
        self.machine = Locked(Machine())
    }

    /// Wraps a connection a listener accepted; it is ready at once.
    init(accepted transport: any ByteStreamTransport, parameters: NetworkParameters<Stack>, remote: Endpoint?) {
        self.endpoint = remote
        self.parameters = parameters
        var machine = Machine()
        machine.phase = .ready(transport)
        machine.state = .ready
        self.machine = Locked(machine)
    }

    deinit {
        if case .ready(let transport) = machine.withLock({ $0.phase }) { transport.close() }
    }

    // MARK: State

    /// The state now; nil before the connection was started.
    public var currentState: ConnectionState? { machine.withLock { $0.state } }

    /// The states this connection goes through, starting with the current one. Finishes after
    /// `failed` or `cancelled`.
    public var states: AsyncStream<ConnectionState> {
        let (stream, continuation) = AsyncStream.makeStream(of: ConnectionState.self, bufferingPolicy: .unbounded)
        let id = UUID()
        let alreadyFinal = machine.withLock { machine in
            if let state = machine.state { continuation.yield(state) }
            if machine.state?.isFinal == true { return true }
            machine.observers[id] = continuation
            return false
        }
        if alreadyFinal { continuation.finish() }
        continuation.onTermination = { [weak self] _ in
            _ = self?.machine.withLock { $0.observers.removeValue(forKey: id) }
        }
        return stream
    }

    /// The peer's identity and why it was trusted; nil until the connection is ready.
    public var peer: PeerIdentity? {
        if case .ready(let transport) = machine.withLock({ $0.phase }) { return transport.peer }
        return nil
    }

    /// What the path is doing now (RTT, congestion window, delivery rate, losses) and which
    /// stack carries it. Empty until the connection is ready.
    public var metrics: ConnectionMetrics {
        get async {
            guard case .ready(let transport) = machine.withLock({ $0.phase }) else { return ConnectionMetrics() }
            var metrics = await transport.metrics()
            metrics.stack = carrier(of: transport).name
            return metrics
        }
    }

    /// The name of the stack carrying the connection ("QUIC", "TCP+TLS"): the declared one, or
    /// for a stack that races several (`FirstOf { QUIC(); TLS() }`) the one whose handshake
    /// completed first. Nil until the connection is ready.
    public var stackName: String? {
        currentTransport().map { carrier(of: $0).name }
    }

    /// Whether the stack carrying this connection offers independent streams and unreliable
    /// datagrams (see ``TransportDescription/hasIndependentStreams``). Starts the connection if
    /// needed: for a stack racing several, only the winner knows.
    public var hasIndependentStreams: Bool {
        get async throws { carrier(of: try await transport()).hasIndependentStreams }
    }

    /// The stack behind `transport`: a race's winner, or the declared stack.
    private func carrier(of transport: any ByteStreamTransport) -> any TransportStack {
        transport.carryingStack ?? parameters.stack.transport.stack
    }

    /// Whether the peer has gone (closed the connection or finished sending), seen without
    /// reading: a receiver asking its user about an offer withdraws the question then.
    public var peerHasEnded: Bool {
        get async {
            guard case .ready(let transport) = machine.withLock({ $0.phase }) else { return currentState?.isFinal ?? false }
            return await transport.hasEnded
        }
    }

    /// Starts the connection if needed and waits until it is ready.
    public func start() async throws {
        _ = try await transport()
    }

    /// Closes the connection in both directions. Pending and later operations fail with
    /// ``QXferError/Code/cancelled``. The close itself happens in the background; see
    /// ``close(errorCode:reason:within:)`` for a program about to exit.
    public func cancel() {
        finish(.cancelled)
    }

    // MARK: Bytes, shared by every stack

    /// Sends raw bytes on the underlying stream, waiting while the transport is full.
    func sendBuffer(_ buffer: ByteBuffer) async throws {
        let transport = try await transport()
        try await withCancellationClosing {
            do {
                try await transport.write(buffer)
            } catch {
                throw self.fail(with: error)
            }
        }
    }

    /// Receives between `atLeast` and `atMost` bytes of the underlying stream.
    func receiveBuffer(atLeast: Int, atMost: Int) async throws -> (ByteBuffer, isComplete: Bool) {
        precondition(atLeast >= 0 && atMost >= max(atLeast, 1), "receive needs 0 <= atLeast <= atMost and atMost >= 1")
        let transport: any ByteStreamTransport
        do {
            transport = try await self.transport()
        } catch let failure as QXferError where failure.code != .cancelled {
            // The connection failed (a send met the peer's close, say), yet what the peer sent
            // before that is the peer's word: the message before a close decides how a transfer
            // ended (docs/PROTOCOL.md §2). Bytes already received are still handed out, those
            // the transport holds too once it has seen the end (so reading it cannot wait).
            // (Only a failure's reason is not `cancelled`: the transport is the failed one.)
            if let remains = endedTransport(), await remains.hasEnded {
                do {
                    return try await inbound.receive(from: remains, atLeast: atLeast, atMost: atMost)
                } catch {
                    throw failure
                }
            }
            if let buffered = await inbound.takeBuffered(atLeast: atLeast, atMost: atMost) { return (buffered, false) }
            throw failure
        }
        return try await withCancellationClosing {
            do {
                return try await self.inbound.receive(from: transport, atLeast: atLeast, atMost: atMost)
            } catch let error as QXferError where error.code == .endOfStream || error.code == .truncated {
                // Our own cancel() also ends the stream: report that, not the peer finishing.
                if case .finished(let reason) = self.machine.withLock({ $0.phase }) { throw reason }
                throw error  // the connection itself is fine; the peer finished
            } catch {
                throw self.fail(with: error)
            }
        }
    }

    // MARK: Life cycle

    struct Machine {
        enum Phase {
            case idle
            case starting([CheckedContinuation<any ByteStreamTransport, any Error>])
            case ready(any ByteStreamTransport)
            case finished(QXferError)
        }
        var phase: Phase = .idle
        /// The transport of a connection that ended, however it did: after a failure what the
        /// peer sent before it is still read from it, and after any end its close can still be
        /// waited for (``NetworkConnection/close(errorCode:reason:within:)``).
        var endedTransport: (any ByteStreamTransport)?
        /// The attempts to connect while starting, cancelled when the connection ends.
        var establishing: Task<any ByteStreamTransport, any Error>?
        var state: ConnectionState?
        var observers: [UUID: AsyncStream<ConnectionState>.Continuation] = [:]

        /// Records and announces a state. Returns the observers to finish, which the caller
        /// must do after releasing the lock: finishing runs their termination handlers, which
        /// take the lock again.
        mutating func enter(_ newState: ConnectionState) -> [AsyncStream<ConnectionState>.Continuation] {
            state = newState
            for observer in observers.values { observer.yield(newState) }
            guard newState.isFinal else { return [] }
            defer { observers.removeAll() }
            return Array(observers.values)
        }
    }

    /// The transport if the connection is ready, without starting it.
    func currentTransport() -> (any ByteStreamTransport)? {
        if case .ready(let transport) = machine.withLock({ $0.phase }) { return transport }
        return nil
    }

    /// The transport of a connection that has ended, whichever way.
    func endedTransport() -> (any ByteStreamTransport)? {
        machine.withLock { $0.endedTransport }
    }

    /// The ready transport; the first caller establishes it, later callers wait for that.
    func transport() async throws -> any ByteStreamTransport {
        let next: StartStep = machine.withLock { machine in
            switch machine.phase {
            case .idle:
                machine.phase = .starting([])
                return .establish
            case .starting: return .wait
            case .ready(let transport): return .ready(transport)
            case .finished(let error): return .failed(error)
            }
        }
        switch next {
        case .ready(let transport): return transport
        case .failed(let error): throw error
        case .wait:
            return try await withCheckedThrowingContinuation { continuation in
                let immediate: Result<any ByteStreamTransport, QXferError>? = machine.withLock { machine in
                    switch machine.phase {
                    case .starting(var waiters):
                        waiters.append(continuation)
                        machine.phase = .starting(waiters)
                        return nil
                    case .ready(let transport): return .success(transport)
                    case .finished(let error): return .failure(error)
                    case .idle: return .failure(QXferError(.invalidUse, "the connection is not started"))
                    }
                }
                if let immediate { continuation.resume(with: immediate) }
            }
        case .establish:
            // The attempts run in a task of their own, so that ``cancel()`` from any task ends
            // them at once: run in the caller's, a connection cancelled while another task
            // started it went on retrying until its connect timeout.
            let establishing = Task { try await self.establish() }
            let ended = machine.withLock { machine -> Bool in
                guard case .starting = machine.phase else { return true }
                machine.establishing = establishing
                return false
            }
            if ended { establishing.cancel() }
            do {
                let transport = try await withTaskCancellationHandler { try await establishing.value } onCancel: { establishing.cancel() }
                let waiters: [CheckedContinuation<any ByteStreamTransport, any Error>]? = machine.withLock { machine in
                    guard case .starting(let waiters) = machine.phase else { return nil }
                    machine.establishing = nil
                    machine.phase = .ready(transport)
                    _ = machine.enter(.ready)
                    return waiters
                }
                guard let waiters else {
                    transport.close()  // cancelled while connecting
                    throw QXferError(.cancelled, "the connection was cancelled")
                }
                for waiter in waiters { waiter.resume(returning: transport) }
                return transport
            } catch {
                let error = (error as? QXferError)
                    ?? (error is CancellationError
                        ? QXferError(.cancelled, "the connection was cancelled")
                        : parameters.stack.transport.stack.describe(error, during: "the connection"))
                finish(error.code == .cancelled ? .cancelled : .failed(error), error: error)
                throw error
            }
        }
    }

    /// Connects, retrying with backoff while the failure may pass, until the connect timeout.
    private func establish() async throws -> any ByteStreamTransport {
        guard let endpoint else { throw QXferError(.invalidUse, "an accepted connection cannot be restarted") }
        let clock = ContinuousClock()
        let deadline = clock.now + parameters.connectTimeout
        var backoff = Duration.milliseconds(250)
        while true {
            _ = machine.withLock { $0.enter(.preparing) }
            try Task.checkCancellation()
            do {
                return try await parameters.stack.transport.stack.connect(
                    to: endpoint, parameters: parameters, timeout: deadline - clock.now, peerAnswered: {})
            } catch let error as QXferError where error.code == .connectFailed {
                let remaining = deadline - clock.now
                guard remaining > .zero else { throw error }
                _ = machine.withLock { $0.enter(.waiting(error)) }
                try await Task.sleep(for: min(backoff, remaining))
                backoff = min(backoff * 2, .seconds(2))
                if clock.now >= deadline { throw error }
            }
        }
    }

    /// Moves to a final state, closing the transport and failing anyone waiting to start.
    private func finish(_ final: ConnectionState, error: QXferError? = nil) {
        let reason = error ?? QXferError(.cancelled, "the connection was cancelled")
        let (transport, waiters, observers, establishing): (
            (any ByteStreamTransport)?, [CheckedContinuation<any ByteStreamTransport, any Error>],
            [AsyncStream<ConnectionState>.Continuation], Task<any ByteStreamTransport, any Error>?
        ) = machine.withLock { machine in
            let previous = machine.phase
            if case .finished = previous { return (nil, [], [], nil) }
            machine.phase = .finished(reason)
            let observers = machine.enter(final)
            let establishing = machine.establishing
            machine.establishing = nil
            switch previous {
            case .ready(let transport):
                machine.endedTransport = transport
                return (transport, [], observers, establishing)
            case .starting(let waiters): return (nil, waiters, observers, establishing)
            default: return (nil, [], observers, establishing)
            }
        }
        establishing?.cancel()
        for observer in observers { observer.finish() }
        transport?.close()
        for waiter in waiters { waiter.resume(throwing: reason) }
    }

    /// Fails the connection with `error` (once) and returns the error to throw.
    private func fail(with error: any Error) -> QXferError {
        if Task.isCancelled {
            cancel()
            return QXferError(.cancelled, "the connection was cancelled")
        }
        let stack = currentTransport().map(carrier(of:)) ?? parameters.stack.transport.stack
        let described = stack.describe(error, during: "the connection")
        finish(.failed(described), error: described)
        return machine.withLock { machine in
            if case .finished(let reason) = machine.phase { return reason }
            return described
        }
    }

    /// Runs an operation whose cancellation closes the connection: a half-done send or
    /// receive leaves the stream at an unknown position, so it cannot be used again.
    private func withCancellationClosing<T: Sendable>(_ operation: @Sendable () async throws -> T) async throws -> T {
        try await withTaskCancellationHandler(operation: operation, onCancel: { self.cancel() })
    }
}

/// What a caller of `transport()` does next.
private enum StartStep {
    case establish, wait, ready(any ByteStreamTransport), failed(QXferError)
}

/// The bytes received but not yet handed to the application; one receiver at a time.
actor InboundBuffer {
    /// What the transport delivered and nobody has taken yet, in order. Kept as the
    /// transport's own buffers: a receive that one of them covers is a slice of it (no copy);
    /// only a receive spanning several is copied, once, into a buffer of its own.
    private var chunks = CircularBuffer<ByteBuffer>()
    private var buffered = 0
    private var finished = false
    private var busy = false

    /// Up to `atMost` of the bytes already received if at least `atLeast` (and one) are; nil
    /// otherwise. Reads nothing.
    func takeBuffered(atLeast: Int, atMost: Int) -> ByteBuffer? {
        guard !busy, buffered >= max(atLeast, 1) else { return nil }
        return take(min(buffered, atMost))
    }

    func receive(from transport: any ByteStreamTransport, atLeast: Int, atMost: Int) async throws -> (ByteBuffer, isComplete: Bool) {
        guard !busy else {
            throw QXferError(.invalidUse, "another task is already receiving on this connection")
        }
        busy = true
        defer {
            busy = false
            finishGathering()
        }
        var reads = 0
        while buffered < max(atLeast, 1), !finished {
            // A long exact receive (a framer's message body) that one read did not complete is
            // gathered into one buffer of its length as the rest arrives. Kept as the
            // transport's buffers, its bytes pinned up to twice their size until the last came
            // (100 TLV bodies of 15 MiB held 2.9 GB resident), and take() copied them again.
            if reads > 0, gathered == nil, atLeast == atMost, atLeast >= Self.gatheredReceiveMinimum { gather(capacity: atLeast) }
            reads += 1
            guard let received = try await transport.read(atLeast: max(atLeast, 1) - buffered) else {
                finished = true
                break
            }
            for chunk in received where chunk.readableBytes > 0 {
                keep(chunk)
                buffered += chunk.readableBytes
            }
        }
        if buffered < atLeast || (atLeast == 0 && buffered == 0 && finished) {
            if buffered == 0 {
                throw QXferError(.endOfStream, "the peer finished sending")
            }
            throw QXferError(.truncated, "the peer closed the connection after \(buffered) of \(atLeast) expected bytes")
        }
        let taken = take(min(buffered, atMost))
        return (taken, finished && buffered == 0)
    }

    /// The storage the queued chunks hold in memory (for tests: a slice pins its whole storage).
    var storageHeld: Int { chunks.reduce(gathered?.capacity ?? 0) { $0 + $1.storageCapacity } }

    /// Whether the last chunk is a compact buffer of this connection's own, with room to append.
    private var lastChunkIsOwn = false

    /// The shortest receive whose bytes are gathered into one buffer as they arrive.
    static let gatheredReceiveMinimum = 64 << 10

    /// The bytes of a long receive gathered so far, before every chunk queued (none while it
    /// is not complete), with room for `gatherRoom` more; held apart from the queue so that
    /// writing into it never copies it (a queued buffer is not uniquely referenced when written
    /// through the queue's subscript).
    private var gathered: ByteBuffer?
    private var gatherRoom = 0

    /// Joins what is queued into one buffer of `capacity` bytes (more than is queued), which then
    /// takes the rest of the receive as it arrives.
    private func gather(capacity: Int) {
        var joined = ByteBuffer()
        joined.reserveCapacity(capacity)
        while var chunk = chunks.popFirst() { joined.writeBuffer(&chunk) }
        gatherRoom = capacity - joined.readableBytes
        gathered = joined
        lastChunkIsOwn = false
    }

    /// Puts the gathered bytes, complete or not, back at the head of the queue.
    private func finishGathering() {
        guard let joined = gathered else { return }
        chunks.prepend(joined)
        gathered = nil
        gatherRoom = 0
    }

    /// Queues `chunk`, small slices of big read buffers copied into compact buffers (a message
    /// assembled from TLS records off a WAN path would otherwise pin many times its size).
    private func keep(_ chunk: ByteBuffer) {
        var chunk = chunk
        if gathered != nil, var part = chunk.readSlice(length: min(chunk.readableBytes, gatherRoom)) {
            gatherRoom -= part.readableBytes
            gathered!.writeBuffer(&part)
            if gatherRoom == 0 { finishGathering() }
            if chunk.readableBytes == 0 { return }  // else the rest follows the gathered bytes
        }
        chunks.appendCompactly(chunk, lastIsOwn: &lastChunkIsOwn)
    }

    private func take(_ count: Int) -> ByteBuffer {
        guard count > 0 else { return ByteBuffer() }
        lastChunkIsOwn = false  // what is taken may be a slice of it: never written to again
        buffered -= count
        var first = chunks.removeFirst()
        if first.readableBytes >= count {
            let slice = first.readSlice(length: count)!
            if first.readableBytes > 0 { chunks.prepend(first) }
            return slice
        }
        var joined = ByteBuffer()
        joined.reserveCapacity(count)
        joined.writeBuffer(&first)
        while joined.readableBytes < count {
            var next = chunks.removeFirst()
            var part = next.readSlice(length: min(count - joined.readableBytes, next.readableBytes))!
            joined.writeBuffer(&part)
            if next.readableBytes > 0 { chunks.prepend(next) }
        }
        return joined
    }
}

/// What came with received bytes.
public struct StreamMetadata: Sendable, Hashable {
    /// True once the peer has finished sending and nothing more will arrive.
    public let isComplete: Bool
}

// MARK: - Byte streams: TLS() and QUIC()

extension NetworkConnection where Stack: ByteStreamProtocol {
    /// Sends bytes, suspending while the transport is full (backpressure); starts the
    /// connection if needed.
    public func send(_ content: some DataProtocol) async throws {
        try await sendBuffer(ByteBuffer(bytes: content))
    }

    /// Receives exactly `count` bytes; throws ``QXferError/Code/truncated`` if the peer
    /// finishes first.
    public func receive(exactly count: Int) async throws -> (content: Data, metadata: StreamMetadata) {
        if count == 0 { return (Data(), StreamMetadata(isComplete: false)) }
        let (buffer, complete) = try await receiveBuffer(atLeast: count, atMost: max(count, 1))
        return (Data(buffer: buffer, byteTransferStrategy: .automatic), StreamMetadata(isComplete: complete))
    }

    /// Receives whatever has arrived, at least `atLeast` and at most `atMost` bytes.
    public func receive(atLeast: Int = 1, atMost: Int) async throws -> (content: Data, metadata: StreamMetadata) {
        let (buffer, complete) = try await receiveBuffer(atLeast: atLeast, atMost: atMost)
        return (Data(buffer: buffer, byteTransferStrategy: .automatic), StreamMetadata(isComplete: complete))
    }

    /// Receives an integer in network byte order (big-endian).
    public func receive<Integer: FixedWidthInteger & Sendable>(as type: Integer.Type) async throws -> (content: Integer, metadata: StreamMetadata) {
        let size = MemoryLayout<Integer>.size
        var (buffer, complete) = try await receiveBuffer(atLeast: size, atMost: size)
        return (buffer.readInteger(endianness: .big, as: Integer.self)!, StreamMetadata(isComplete: complete))
    }
}
