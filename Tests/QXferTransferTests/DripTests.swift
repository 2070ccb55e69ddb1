import Foundation
import QXfer
import LinuxSystem
@testable import QXferTransfer
import Testing

/// Peers that keep a connection moving without getting anywhere (issue 66, 6 and 7): one that
/// drips Continuations and never finishes its Offer, one that reads a large Accept a little at a
/// time. Each phase has a bound that a drip cannot reset; here the bounds are made short so the
/// tests take seconds, and the peers are far slower than the bounds allow.
@Suite("A slow or dripping peer is cut off")
struct DripTests {
    @Test("A drip of Continuations does not hold the offer phase past its deadline", arguments: StackKind.allCases)
    func continuationDrip(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        // 1 s of silence allowed, and the whole Offer within 1 s plus 1 s per 128 KiB: a
        // 5-byte part every 0.25 s never lets the silence limit fire.
        let receiver = TransferReceiver(directory: dst, offerTimeout: .seconds(1))
        let clock = ContinuousClock()
        let outcome = try await withDialedReceiver(kind, receiver) { dial in
            let peer = try await dial.raw()
            let started = clock.now
            let answer = try await withThrowingTaskGroup(of: Message??.self) { group in
                group.addTask {
                    // Long past the deadline (~1 s), so that a loaded machine still sees the cut-off.
                    while clock.now - started < .seconds(30) {
                        guard (try? await peer.write(frame(type: MessageCodec.continuationType, body: [0, 0, 0, 1, 0x2a]))) != nil else { break }
                        try await Task.sleep(for: .milliseconds(250))
                    }
                    return .none  // still dripping, never answered
                }
                group.addTask { .some(try? await peer.readMessage()) }
                defer { group.cancelAll() }
                return try await group.next()!
            }
            return (answer, clock.now - started)
        }
        // No bound on the time taken: the drip outlasting its deadline is what fails.
        let (answer, _) = try outcome.client.get()
        let ended = try #require(outcome.ended.first)
        #expect(throws: TransferError(.protocolViolation, "")) { try ended.get() }
        if case .failure(let error as TransferError) = ended {
            #expect(error.message.contains("made no offer") && !error.message.contains("\n"), "\(error.message)")
        }
        switch answer {
        case .some(.error(let refusal)?): #expect(refusal.code == .protocolViolation, "\(refusal.message)")
        case .some(nil): break  // cut off with the Error still in flight: the receiver's own result says why
        default: Issue.record("the dripping sender was never answered: \(String(describing: answer))")
        }
    }
    @Test("A slow reader of a large control message is cut off at its deadline, the connection closed", arguments: StackKind.allCases)
    func slowReaderOfAControlMessage(_ kind: StackKind) async throws {
        // 1 300 000 answers, 15.6 MB: more than either stack buffers between the two ends
        // (some 1.3 MB over QUIC, up to 9 MB over TCP on loopback as the kernel grows its
        // buffers), so the send waits on the reader, who takes 320 KiB/s.
        let accept = Message.accept(Accept(answers: Array(repeating: .sendAll, count: 1_300_000)))
        let serverDone = Locked(false)
        let pace = PeerPace(allowance: .milliseconds(500), bytesPerSecond: 64 << 20)
        let clock = ContinuousClock()
        let outcome = try await withDialedServer(kind, serve: { served in
            let started = clock.now
            defer { serverDone.withLock { $0 = true } }
            do {
                try await served.send(accept, within: pace)
                return (nil as TransferError?, clock.now - started)
            } catch let error as TransferError {
                return (error, clock.now - started)
            }
        }, client: { dial in
            let peer = try await dial.raw()
            try await peer.write([0])  // a QUIC stream opens with its first byte
            let started = clock.now
            var read = 0
            // The reader would take 50 s to read it all; it gives up at 40 s, long past the
            // deadline (~4 s plus encoding), so a loaded machine still sees the cut-off.
            while clock.now - started < .seconds(40), !serverDone.withLock({ $0 }), await !peer.hasEnded {
                let n = (try? await peer.read(atMost: 16 << 10)) ?? 0
                if n == 0 { break }
                read += n
                try await Task.sleep(for: .milliseconds(50))
            }
            return (read, clock.now - started)
        })
        let (error, held) = try #require(try outcome.ended.first?.get())
        let sendError = try #require(error, "the Accept was sent in full after \(held)")
        #expect(sendError.code == .cancelled && sendError.message.contains("did not take the Accept"), "\(sendError.message)")
        #expect(!sendError.message.contains("\n"))
        // Cut off by the deadline, not by the reader giving up: no bound on the time taken.
        #expect(held < .seconds(40), "the slow reader held the sender for \(held)")
        let (read, _) = try outcome.client.get()
        #expect(read < 15_600_004, "the slow reader got the whole Accept")
    }

    /// QUIC only: the stream window and send buffer hold about 1.3 MB between the two ends, so
    /// an Accept of 150 000 entries (1.8 MB) waits on its reader. Over TCP+TLS on loopback the
    /// kernel takes 2 to 4 MB, and an Offer large enough to exceed it takes the receiver too
    /// long to plan in a debug build; the bound itself is shown on both stacks above.
    @Test("A sender that reads its Accept slowly is cut off, and the names it claimed are free for another sender")
    func slowAcceptReaderLetsGoOfItsClaims() async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        let source = scratch.sub("7")
        let content = pattern(1000, seed: 66)
        try Data(content).write(to: URL(fileURLWithPath: source))
        let tree = try SourceTree.scan([source])

        let clock = ContinuousClock()
        var receiver = TransferReceiver(directory: dst)
        // The default 10 s allowance: the Accept is due by ~10.4 s, long before the reader's
        // 30 s, and the second sender, however late a loaded machine runs it, is not held to
        // the data rate before 10 s either.
        receiver.minimumRate = 4 << 20
        let entries = (0..<150_000).map { OfferEntry(kind: .file, path: ["\($0)"], size: 1, mode: 0o644, modificationTime: 0) }
        let offer = MessageCodec.encodeFrame(.offer(Offer(algorithm: .xxh3_128, entries: entries)))
        let outcome = try await withDialedReceiver(.quic, receiver, expectedEnds: 2) { dial in
            let slow = try await dial.raw()
            try await slow.write(offer)
            // 40 KiB/s, from the first byte of the answer on: the 1.8 MB Accept would take 45 s.
            // Its window opens at the answer's first byte (planning 150 000 entries takes a
            // loaded debug build seconds), and ends long past the deadline (~1 s).
            var read = (try? await slow.read(atMost: 1)) ?? 0
            var cutOff = read == 0
            let started = clock.now
            while !cutOff, clock.now - started < .seconds(30) {
                guard await !slow.hasEnded, let n = try? await slow.read(atMost: 8 << 10), n > 0 else {
                    cutOff = true
                    break
                }
                read += n
                try await Task.sleep(for: .milliseconds(200))
            }
            // Another sender offers one of the names the slow one claimed.
            let second = try await dial.framed(as: anotherSender).runSender(TransferSender(tree: tree))
            return (cutOff, read, second)
        }
        let (cutOff, read, second) = try outcome.client.get()
        #expect(cutOff, "the slow reader was never cut off (it read \(read) bytes)")
        #expect(second.succeeded == 1 && second.failures.isEmpty, "the second sender: \(second.failures)")
        #expect(readFile(dst + "/7") == content)
        let slowEnd = try #require(outcome.ended.first)
        #expect(throws: TransferError(.cancelled, "")) { try slowEnd.get() }
    }
}

/// A sender identity other than ``clientIdentity`` (the same one would take over, not be
/// answered busy).
private let anotherSender = try! HostIdentity.ephemeral(commonName: "another sender")

// MARK: - A receiver to dial

/// A connection that writes and reads bytes as they are, with no framer: to send frames
/// by hand, part by part, and to read the receiver's answer a few bytes at a time.
protocol RawPeer: Sendable {
    func write(_ bytes: [UInt8]) async throws
    /// Reads up to `count` bytes; fewer when fewer have arrived, none at the end.
    func read(atMost count: Int) async throws -> Int
    /// Reads one whole message (header, then body).
    func readMessage() async throws -> Message?
    /// Whether the receiver has closed, seen without reading what it sent before.
    var hasEnded: Bool { get async }
    func cancel()
}

private struct RawConnection<Transport: SecureTransport>: RawPeer {
    let connection: NetworkConnection<Transport>
    func write(_ bytes: [UInt8]) async throws { try await connection.send(bytes) }
    func read(atMost count: Int) async throws -> Int {
        do {
            return try await connection.receive(atLeast: 1, atMost: count).content.count
        } catch let error as QXferError where error.code == .endOfStream {
            return 0
        }
    }
    func readMessage() async throws -> Message? {
        let header = try await connection.receive(exactly: MessageCodec.headerSize).content
        let type = header.withUnsafeBytes { UInt32(bigEndian: $0.loadUnaligned(as: UInt32.self)) }
        let length = header.withUnsafeBytes { UInt32(bigEndian: $0.loadUnaligned(fromByteOffset: 4, as: UInt32.self)) }
        guard length <= ProtocolLimits.maximumMessageSize else { throw TransferError(.limitExceeded, "a frame of \(length) bytes") }
        let body = try await connection.receive(exactly: Int(length)).content
        return try MessageCodec.decode(type: type, body: body)
    }
    var hasEnded: Bool { get async { await connection.peerHasEnded } }
    func cancel() { connection.cancel() }
}

/// Connects to the receiver under test: raw, or framed as a real sender is.
protocol Dialer: Sendable {
    func raw() async throws -> any RawPeer
    func framed(as identity: HostIdentity) -> any TransferPeer
}

private struct LoopbackDialer<Transport: SecureTransport>: Dialer {
    let transport: Transport
    let port: UInt16
    let opened: Locked<[@Sendable () -> Void]>

    func raw() async throws -> any RawPeer {
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
            transport.identity(clientIdentity).peerFingerprint(serverIdentity.fingerprint)
        }
        opened.withLock { $0.append { connection.cancel() } }
        try await connection.start()
        return RawConnection(connection: connection)
    }

    func framed(as identity: HostIdentity) -> any TransferPeer {
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
            TLV { transport.identity(identity).peerFingerprint(serverIdentity.fingerprint) }
        }
        opened.withLock { $0.append { connection.cancel() } }
        return Peer(connection: connection)
    }
}

/// The receiving end of a dialed connection, for a test that runs it directly.
protocol Served: Sendable {
    func run(_ receiver: TransferReceiver) async throws -> TransferSummary
    func send(_ message: Message, within pace: PeerPace) async throws
}

private struct ServedConnection<Stack: TLVStack>: Served {
    let connection: NetworkConnection<Stack>
    func run(_ receiver: TransferReceiver) async throws -> TransferSummary { try await receiver.run(over: connection) }
    func send(_ message: Message, within pace: PeerPace) async throws { try await connection.send(message, within: pace) }
}

/// What the dialing side returned, and the server's results in the order its connections ended.
struct DialedOutcome<Server: Sendable, Client: Sendable>: Sendable {
    var client: Result<Client, any Error>
    var ended: [Result<Server, any Error>]
}

/// Runs `receiver` behind a loopback listener of `kind` (one copy per connection, as
/// `qxfer recv` does) and `client` with a way to dial it.
func withDialedReceiver<Client: Sendable>(
    _ kind: StackKind, _ receiver: TransferReceiver, expectedEnds: Int = 1,
    _ client: @escaping @Sendable (any Dialer) async throws -> Client
) async throws -> DialedOutcome<TransferSummary, Client> {
    try await withDialedServer(kind, expectedEnds: expectedEnds, serve: { try await $0.run(receiver) }, client: client)
}

/// Runs `serve` on each connection a loopback listener of `kind` accepts, and `client` with a
/// way to dial it; returns once `client` has and `expectedEnds` connections have ended on the
/// server (or 10 s more have passed).
func withDialedServer<Server: Sendable, Client: Sendable>(
    _ kind: StackKind, expectedEnds: Int = 1,
    serve: @escaping @Sendable (any Served) async throws -> Server,
    client: @escaping @Sendable (any Dialer) async throws -> Client
) async throws -> DialedOutcome<Server, Client> {
    switch kind {
    case .quic: try await dialedServer(QUIC(), expectedEnds, serve, client)
    case .tls: try await dialedServer(TLS(), expectedEnds, serve, client)
    }
}

private func dialedServer<Transport: SecureTransport, Server: Sendable, Client: Sendable>(
    _ transport: Transport, _ expectedEnds: Int,
    _ serve: @escaping @Sendable (any Served) async throws -> Server,
    _ client: @escaping @Sendable (any Dialer) async throws -> Client
) async throws -> DialedOutcome<Server, Client> {
    let listener = NetworkListener(on: 0, host: "127.0.0.1") { TLV { transport.identity(serverIdentity) } }
    let (results, continuation) = AsyncStream.makeStream(of: Result<Server, any Error>.self)
    return try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask {
            try await listener.run { connection in
                let result: Result<Server, any Error>
                do { result = .success(try await serve(ServedConnection(connection: connection))) } catch { result = .failure(error) }
                continuation.yield(result)
            }
        }
        let dialer = LoopbackDialer(transport: transport, port: try await listener.port, opened: Locked([]))
        let outcome: Result<Client, any Error>
        do { outcome = .success(try await client(dialer)) } catch { outcome = .failure(error) }
        var ended: [Result<Server, any Error>] = []
        let waited = Task {
            try await Task.sleep(for: .seconds(10))
            continuation.finish()
        }
        for await result in results {
            ended.append(result)
            if ended.count == expectedEnds { break }
        }
        waited.cancel()
        for cancel in dialer.opened.withLock({ $0 }) { cancel() }
        group.cancelAll()
        return DialedOutcome(client: outcome, ended: ended)
    }
}

/// One frame as it goes on the wire: type, length, body.
func frame(type: UInt32, body: [UInt8]) -> [UInt8] {
    var bytes: [UInt8] = []
    bytes.reserveCapacity(MessageCodec.headerSize + body.count)
    withUnsafeBytes(of: type.bigEndian) { bytes.append(contentsOf: $0) }
    withUnsafeBytes(of: UInt32(body.count).bigEndian) { bytes.append(contentsOf: $0) }
    bytes.append(contentsOf: body)
    return bytes
}

