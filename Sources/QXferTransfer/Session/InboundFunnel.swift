/// Brings the messages of several streams (the control stream and the data streams of a QUIC
/// connection) into the one task that owns the receiver's files, one message per stream at a
/// time: a reader waits until its message has been handled before reading the next, so a slow
/// disk slows the readers, the readers stop extending the transport's windows, and the sender
/// slows down. Memory stays at one message per stream.
final class InboundFunnel: Sendable {
    /// Which stream a message came from.
    enum Source: Hashable, Sendable {
        case control
        case data(Int)
        /// Not a stream: the committer's outcomes.
        case committer
    }

    /// What a reader saw.
    enum Event: Sendable {
        case message(Message)
        case ended
        case failed(any Error)
        /// The committer finished a group of verified files (see ``FileCommitter``).
        case committed([CommitOutcome])
    }

    typealias Delivery = (source: Source, event: Event, handled: CheckedContinuation<Void, Never>)

    private let stream: AsyncStream<Delivery>
    private let continuation: AsyncStream<Delivery>.Continuation

    init() {
        (stream, continuation) = AsyncStream.makeStream(of: Delivery.self)
    }

    /// The consumer's side; take it once.
    func makeIterator() -> AsyncStream<Delivery>.AsyncIterator { stream.makeAsyncIterator() }

    /// Reads `next` until the stream ends or fails, handing over one message at a time;
    /// `handled` is called once each message was.
    func pump(_ source: Source, handled: () -> Void = {}, _ next: () async throws -> Message?) async {
        while true {
            let event: Event
            do {
                event = try await next().map(Event.message) ?? .ended
            } catch {
                event = .failed(error)
            }
            await deliver(source, event)
            guard case .message = event else { return }
            handled()
            guard !Task.isCancelled else { return }
        }
    }

    /// Hands the consumer a failure that did not come from a stream (the transfer was taken
    /// over, a reset data stream's reason never came), as if the control stream had failed;
    /// returns once it was handled.
    func interrupt(with error: any Error) async {
        await deliver(.control, .failed(error))
    }

    /// Hands the consumer the committer's outcomes; returns once they were handled.
    func post(committed outcomes: [CommitOutcome]) async {
        await deliver(.committer, .committed(outcomes))
    }

    private func deliver(_ source: Source, _ event: Event) async {
        await withCheckedContinuation { handled in
            if case .terminated = continuation.yield((source, event, handled)) { handled.resume() }
        }
    }

    /// Stops taking messages and releases every reader still waiting.
    func close(draining iterator: inout AsyncStream<Delivery>.AsyncIterator) async {
        continuation.finish()
        while let pending = await iterator.next() { pending.handled.resume() }
    }
}
