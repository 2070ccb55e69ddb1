import NIOCore

/// Memory that the framers of many connections share for the messages they are receiving.
///
/// A ``TLV`` or ``Coder`` framer holds each message's body until all of it has arrived, and a
/// body may be as long as `maximumMessageSize`. One connection holds at most one such body,
/// but a listener has many connections (QUIC: also many streams each). A client that opens
/// thousands and starts a long message on each could make a server hold that many bodies at
/// once. Give a listener's framers one allowance. Each then reserves a body's length from it
/// before reading the body and gives it back once the message is handed over. A body that does
/// not fit waits, first come first served, until others are handed over. The peer is not read
/// meanwhile, so the transport's flow control holds it back.
///
/// ```swift
/// let allowance = MessageAllowance(bytes: 512 << 20)
/// let listener = NetworkListener(on: 7000, using: .parameters {
///     TLV(allowance: allowance) { QUIC().identity(identity) }
/// })
/// ```
public final class MessageAllowance: Sendable {
    /// The most bytes of message bodies held at once, by all the framers that share this.
    public let capacity: Int

    private struct Waiter {
        var id: UInt64
        var bytes: Int
        var continuation: CheckedContinuation<Void, any Error>
    }
    private struct State {
        var reserved = 0
        var waiting = CircularBuffer<Waiter>()
        var nextID: UInt64 = 0
    }
    private let state = Locked(State())

    /// An allowance of `bytes` (at least 1).
    public init(bytes: Int) {
        capacity = max(1, bytes)
    }

    /// Bytes reserved now, by bodies being received.
    public var reservedBytes: Int { state.withLock { $0.reserved } }

    /// Framers waiting for room now.
    public var waitingCount: Int { state.withLock { $0.waiting.count } }

    /// Reserves `bytes`, waiting until they fit behind every earlier request. Throws
    /// ``QXferError/Code/messageTooLarge`` for more than the whole capacity, and
    /// ``QXferError/Code/cancelled`` when the task is cancelled while waiting.
    func reserve(_ bytes: Int) async throws {
        guard bytes > 0 else { return }
        guard bytes <= capacity else {
            throw QXferError(.messageTooLarge, "the peer sent a \(bytes)-byte message; this side holds at most \(capacity) bytes of messages at once")
        }
        let id = state.withLock { state in
            defer { state.nextID &+= 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let granted = state.withLock { state -> Bool? in
                    // Cancelled before it could wait: the handler ran and found nothing to remove.
                    if Task.isCancelled { return nil }
                    if state.waiting.isEmpty, bytes <= capacity - state.reserved {
                        state.reserved += bytes
                        return true
                    }
                    state.waiting.append(Waiter(id: id, bytes: bytes, continuation: continuation))
                    return false
                }
                switch granted {
                case true?: continuation.resume()
                case false?: break
                case nil: continuation.resume(throwing: QXferError(.cancelled, "cancelled while waiting for memory to receive a message"))
                }
            }
        } onCancel: {
            let removed = state.withLock { state -> Waiter? in
                guard let index = state.waiting.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiting.remove(at: index)
            }
            removed?.continuation.resume(throwing: QXferError(.cancelled, "cancelled while waiting for memory to receive a message"))
            // A waiter at the head may have held back smaller ones behind it.
            resumeWaiters()
        }
    }

    /// Gives back `bytes` reserved by ``reserve(_:)``, letting waiters in turn.
    func release(_ bytes: Int) {
        guard bytes > 0 else { return }
        state.withLock { $0.reserved -= bytes }
        resumeWaiters()
    }

    /// Grants the waiters at the head of the queue that fit now; resumes them outside the lock.
    private func resumeWaiters() {
        let granted = state.withLock { state in
            var granted: [CheckedContinuation<Void, any Error>] = []
            while let first = state.waiting.first, first.bytes <= capacity - state.reserved {
                state.reserved += first.bytes
                granted.append(state.waiting.removeFirst().continuation)
            }
            return granted
        }
        for continuation in granted { continuation.resume() }
    }
}
