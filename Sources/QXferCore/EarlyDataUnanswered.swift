/// Why a connection that handed its first bytes over as early data (0-RTT) failed before its
/// handshake completed: the peer stayed silent (in a race, for `FirstOf`'s `earlyAnswerDeadline`)
/// or its address refused. The `underlying` error of that ``QXferError`` (`connectFailed`).
/// Nothing of what went early was accepted, so the program may connect again at once: that
/// connection sends nothing early, and QUIC races the name's addresses, a `FirstOf` its stacks.
public struct EarlyDataUnanswered: Error, Sendable {
    /// The peer that did not answer.
    public let endpoint: Endpoint
    /// The stack that sent early, by name.
    public let stack: String

    /// The failure of an early connection to `endpoint` over `stack`.
    public init(endpoint: Endpoint, stack: String) {
        self.endpoint = endpoint
        self.stack = stack
    }
}
