@_spi(Stacks) import QXferCore
import QXferIdentity

/// Several stacks in order of preference: a connection uses whichever completes its handshake
/// first.
///
/// ```swift
/// let connection = NetworkConnection(to: peer) { FirstOf { QUIC(); TLS() } }
/// try await connection.send(Data("hello".utf8))
/// print(connection.stackName ?? "-")   // "QUIC", or "TCP+TLS" where UDP is blocked
/// ```
///
/// A program written for `QUIC()` runs unchanged with this line: the connection starts the
/// first stack at once and the next one after ``attemptDelay`` (250 ms, RFC 8305's
/// connection-attempt delay) or as soon as the one before it fails; the first handshake to
/// complete wins and the others are cancelled. From then on everything the connection offers
/// (streams, datagrams, framers, trust, states) is the winner's: ``NetworkConnection/stackName``
/// and `metrics.stack` name it, ``NetworkConnection/hasIndependentStreams`` says whether QUIC's
/// extras are real. While the race runs the connection is `preparing` (or `waiting` between
/// retries), never `failed`.
///
/// When the stacks that answered all refused (TCP's "connection refused") and the others stay
/// silent for ``refusalGrace`` (one second), the attempt ends with "nothing listens on
/// host:port, neither TCP nor UDP": a ``QXferError/Code/connectFailed`` whose `underlying` is
/// ``NothingListens``, which the connection retries until its connect timeout like any refusal.
///
/// With ``sendingEarly(answerWithin:)``, a connection whose first stack can send early data to
/// the peer (QUIC resuming with a ticket from a receiver this host trusts) skips the race: that
/// stack leads alone and the first bytes written go as 0-RTT. If the peer does not answer
/// within the deadline, the connection fails with a ``QXferError/Code/connectFailed`` whose
/// `underlying` is ``EarlyDataUnanswered``: the program connects again (what it wrote may have
/// reached the peer or not), and that connection races, as every later one to that peer in
/// this process.
///
/// A listener with this stack listens on every stack, on the same port number.
public struct FirstOf: SecureTransport {
    /// The stacks, most preferred first.
    public var stacks: [any SecureTransport]
    /// How long the race waits for a stack before starting the next one.
    public var attemptDelay: Duration = .milliseconds(250)
    /// Once every stack that answered refused, how long (from the race's start) the silent ones
    /// still get before the attempt ends with "nothing listens".
    public var refusalGrace: Duration = .seconds(1)
    /// Where a host whose first stack was refused or silent is remembered with the winner; nil
    /// remembers nothing.
    public var memory: StackMemory?
    /// How long a first stack that sends early data alone waits for the peer's answer; nil
    /// (the default) always races.
    public var earlyAnswerDeadline: Duration?

    /// The stacks in order of preference, as `FirstOf { QUIC(); TLS() }`.
    public init(@FirstOfBuilder _ stacks: () -> [any SecureTransport]) {
        self.stacks = stacks()
    }

    /// Remembers per host which stack won when the first was refused or stayed silent (not when
    /// it merely lost a close race), so the next connection to that host starts with the winner
    /// at once, until the memory's entry expires (see ``StackMemory``).
    public func remembering(_ memory: StackMemory?) -> FirstOf {
        var copy = self
        copy.memory = memory
        return copy
    }

    /// Lets the first stack lead alone, sending early data, when it can (see above); a peer
    /// silent for `deadline` ends the connection with ``EarlyDataUnanswered``.
    public func sendingEarly(answerWithin deadline: Duration = .seconds(1)) -> FirstOf {
        var copy = self
        copy.earlyAnswerDeadline = deadline
        return copy
    }

    /// Sets how long the race waits for a stack before starting the next one.
    public func attemptDelay(_ delay: Duration) -> FirstOf {
        var copy = self
        copy.attemptDelay = delay
        return copy
    }

    /// Sets how long silent stacks still get once every stack that answered refused: longer for
    /// a peer that may be slow to answer a handshake, shorter to fail faster where nothing listens.
    public func refusalGrace(_ grace: Duration) -> FirstOf {
        var copy = self
        copy.refusalGrace = grace
        return copy
    }

    public var transport: TransportDescription {
        TransportDescription(RaceStack(
            candidates: stacks.map { $0.transport.stack.racing() }, attemptDelay: attemptDelay, refusalGrace: refusalGrace, memory: memory,
            earlyLeader: earlyAnswerDeadline.flatMap { deadline in stacks.first.map { ($0.transport.stack, deadline) } }))
    }

    /// The first stack's identity; setting it sets every stack's.
    public var identity: HostIdentity? {
        get { stacks.first?.identity }
        set { stacks = stacks.map { var stack = $0; stack.identity = newValue; return stack } }
    }

    /// The first stack's trust; setting it sets every stack's.
    public var peerTrust: PeerTrust {
        get { stacks.first?.peerTrust ?? .knownHosts() }
        set { stacks = stacks.map { var stack = $0; stack.peerTrust = newValue; return stack } }
    }

    /// The first stack's client authentication; setting it sets every stack's.
    public var clientAuthentication: ClientAuthentication {
        get { stacks.first?.clientAuthentication ?? .optional }
        set { stacks = stacks.map { var stack = $0; stack.clientAuthentication = newValue; return stack } }
    }
}

/// Collects the stacks of a ``FirstOf`` declaration, most preferred first.
@resultBuilder
public enum FirstOfBuilder {
    public static func buildBlock(_ stacks: any SecureTransport...) -> [any SecureTransport] { stacks }
}

/// Why a race ended with "nothing listens": every stack that answered refused, the others were
/// silent. The `underlying` error of that ``QXferError``.
public struct NothingListens: Error, Sendable {
    /// Where nothing listens.
    public let endpoint: Endpoint
    /// The stacks tried, by name.
    public let stacks: [String]
}
