/// Why reaching a peer by code failed: one line a user understands.
public struct ReachError: Error, Sendable, CustomStringConvertible, Equatable {
    public enum Kind: Sendable, Equatable {
        /// The relay could not be reached (or a LAN sender could not be found).
        case relayUnreachable
        /// Another sender holds this code's room: draw another code.
        case roomTaken
        /// No sender is waiting with this code (mistyped, expired, or the sender stopped).
        case noSuchCode
        /// The code's one attempt was used.
        case codeUsed
        /// The relay refused, saying why.
        case refusedByRelay
        /// The other side did not come, or did not answer, in time.
        case timedOut
        /// The relay or the peer broke docs/PROTOCOL.md §9.
        case protocolViolation
        /// The peer left before the transfer began.
        case peerGone
        /// The code did not authenticate the peer (wrong code, or someone in between).
        case wrongCode
        /// A local socket could not be opened.
        case local
    }

    public let kind: Kind
    public let description: String

    public init(_ kind: Kind, _ description: String) {
        self.kind = kind
        self.description = description
    }
}
