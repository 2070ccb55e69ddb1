import Foundation
import NIOCore
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// Framers over a scripted in-memory stream: exact bytes, any chunking, hostile lengths.
@Suite("Framers in memory")
struct FramerTests {
    typealias TLVStack = TLV<TLS>

    func tlvConnection(_ bytes: [UInt8], chunkSize: Int, limit: Int = 1024) -> (NetworkConnection<TLVStack>, ScriptedStream) {
        let stream = ScriptedStream(bytes, chunkSize: chunkSize)
        let connection = NetworkConnection(
            accepted: stream, parameters: .parameters { TLV(maximumMessageSize: limit) { TLS() } }, remote: nil)
        return (connection, stream)
    }

    /// What a sender writes for these messages.
    func encodeTLV(_ messages: [(UInt32, [UInt8])], limit: Int = 1024) async throws -> [UInt8] {
        let (sender, stream) = tlvConnection([], chunkSize: 1, limit: limit)
        for (type, payload) in messages { try await sender.send(payload, type: type) }
        return stream.written
    }

    @Test("TLV round trip, delivered one byte at a time, including empty and maximum-size messages")
    func tlvRoundTrip() async throws {
        let messages: [(UInt32, [UInt8])] = [(7, Array("hello".utf8)), (0, []), (UInt32.max, Array(repeating: 0xab, count: 1024))]
        let wire = try await encodeTLV(messages)
        #expect(Array(wire.prefix(13)) == [0, 0, 0, 7, 0, 0, 0, 5] + Array("hello".utf8))
        for chunkSize in [1, 3, 8, 4096] {
            let (receiver, _) = tlvConnection(wire, chunkSize: chunkSize)
            var received: [(UInt32, [UInt8])] = []
            for try await (content, metadata) in receiver.messages { received.append((metadata.type, Array(content))) }
            #expect(received.map(\.0) == messages.map(\.0))
            #expect(received.map(\.1) == messages.map(\.1))
        }
    }

    @Test("A TLV length over the limit fails before allocating and leaves the connection to the application (to send its Error)")
    func tlvOverLimit() async throws {
        let wire: [UInt8] = [0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]
        let (receiver, _) = tlvConnection(wire, chunkSize: 1)
        let error = await #expect(throws: QXferError.self) { _ = try await receiver.receive() }
        #expect(error?.code == .messageTooLarge)
        #expect(error?.message.contains("4294967295-byte") == true)
        if case .cancelled? = receiver.currentState {
            Issue.record("the framer closed the connection itself: the application could not say why")
        }
        receiver.cancel()
    }

    /// A transport whose peer closed: it hands out `reads` one by one (only after the close
    /// is known, as the stacks' transports do), then fails every read and write.
    final class ClosedByPeer: ByteStreamTransport, @unchecked Sendable {
        // Only the one reader of the test touches `reads`.
        private var reads: [[ByteBuffer]]
        let peer = PeerIdentity(fingerprint: nil, trust: .unauthenticated, applicationProtocol: "qxfer/1")
        static let closed = QXferError(.connectionClosed, "the peer closed the connection (error 2: too large)")
        init(_ reads: [[UInt8]]) { self.reads = reads.map { [ByteBuffer(bytes: $0)] } }
        func read() async throws -> [ByteBuffer]? {
            if reads.isEmpty { throw Self.closed }
            return reads.removeFirst()
        }
        func write(_ buffer: ByteBuffer) async throws { throw Self.closed }
        func finish() async throws {}
        func reset(errorCode: UInt64) {}
        func close() {}
        func metrics() async -> ConnectionMetrics { ConnectionMetrics() }
        var multiplexer: (any StreamMultiplexer)? { nil }
        var hasEnded: Bool { get async { true } }
    }

    @Test("A message that arrived before the connection failed is still read: the peer's Error before its close",
          arguments: [false, true])
    func messageOutlivesAFailedSend(lastStillInTransport: Bool) async throws {
        let first = try await encodeTLV([(1, Array("first".utf8))])
        let lastWord = Array("the peer's last word".utf8)
        let last = try await encodeTLV([(2, lastWord)])
        // Both messages in one read (the second already taken from the transport when the send
        // fails), or the second still waiting inside the transport.
        let reads = lastStillInTransport ? [first, last] : [first + last]
        let connection = NetworkConnection(
            accepted: ClosedByPeer(reads), parameters: .parameters { TLV(maximumMessageSize: 1024) { TLS() } }, remote: nil)
        #expect(try await connection.receive().metadata.type == 1)
        // A send (another task's, in a transfer) meets the close: the connection has failed.
        await #expect(throws: QXferError.self) { try await connection.send(Array("x".utf8), type: 3) }
        #expect(connection.currentState?.isFinal == true)
        let received = try await connection.receive()
        #expect(received.metadata.type == 2 && Array(received.content) == lastWord)
        let failure = await #expect(throws: QXferError.self) { _ = try await connection.receive() }
        #expect(failure?.message.contains("error 2") == true, "\(String(describing: failure))")
    }

    @Test("After our own cancel() a receive fails at once, whatever was received")
    func cancelEndsReceivesAtOnce() async throws {
        let wire = try await encodeTLV([(1, Array("first".utf8)), (2, Array("second".utf8))])
        let cancelled = NetworkConnection(
            accepted: ClosedByPeer([wire]), parameters: .parameters { TLV(maximumMessageSize: 1024) { TLS() } }, remote: nil)
        #expect(try await cancelled.receive().metadata.type == 1)
        cancelled.cancel()
        let refusal = await #expect(throws: QXferError.self) { _ = try await cancelled.receive() }
        #expect(refusal?.code == .cancelled)
    }

    @Test("Sending a TLV message over the limit is refused locally")
    func tlvSendOverLimit() async throws {
        let (sender, stream) = tlvConnection([], chunkSize: 1, limit: 4)
        await #expect(throws: QXferError.self) { try await sender.send([1, 2, 3, 4, 5], type: 1) }
        #expect(stream.written.isEmpty)
    }

    @Test("A stream cut inside a TLV message is a truncation, cut between messages a clean end")
    func tlvTruncated() async throws {
        let wire = try await encodeTLV([(1, Array(repeating: 1, count: 100))])
        let (cut, _) = tlvConnection(Array(wire.prefix(50)), chunkSize: 7)
        let error = await #expect(throws: QXferError.self) { _ = try await cut.receive() }
        #expect(error?.code == .truncated)

        let (cutInHeader, _) = tlvConnection(Array(wire.prefix(5)), chunkSize: 2)
        let headerError = await #expect(throws: QXferError.self) { _ = try await cutInHeader.receive() }
        #expect(headerError?.code == .truncated)

        let (whole, _) = tlvConnection(wire, chunkSize: 7)
        _ = try await whole.receive()
        let end = await #expect(throws: QXferError.self) { _ = try await whole.receive() }
        #expect(end?.code == .endOfStream)
    }

    enum Chat: Codable, Sendable, Equatable {
        case hello(name: String)
        case line(String)
    }

    @Test("Coder round trip in JSON and property lists", arguments: [CoderFormat.json, .propertyList])
    func coderRoundTrip(format: CoderFormat) async throws {
        let outbound = ScriptedStream([], chunkSize: 1)
        let sender = NetworkConnection(
            accepted: outbound, parameters: .parameters { Coder(Chat.self, using: format) { TLS() } }, remote: nil)
        let sent: [Chat] = [.hello(name: "ada"), .line(""), .line(String(repeating: "é", count: 3000))]
        for message in sent { try await sender.send(message) }

        let inbound = ScriptedStream(outbound.written, chunkSize: 5)
        let receiver = NetworkConnection(
            accepted: inbound, parameters: .parameters { Coder(Chat.self, using: format) { TLS() } }, remote: nil)
        var received: [Chat] = []
        for try await message in receiver.messages { received.append(message) }
        #expect(received == sent)
    }

    @Test("A Coder message that does not decode fails the connection with a clear error")
    func coderGarbage() async throws {
        let garbage = Array("{not json".utf8)
        let wire = [0, 0, 0, UInt8(garbage.count)] + garbage
        let receiver = NetworkConnection(
            accepted: ScriptedStream(wire, chunkSize: 1),
            parameters: .parameters { Coder(Chat.self, using: .json) { TLS() } }, remote: nil)
        let error = await #expect(throws: QXferError.self) { _ = try await receiver.receive() }
        #expect(error?.code == .malformedMessage)
    }

    @Test("Integers arrive in network byte order; exact receives span chunks")
    func integersAndExactReceives() async throws {
        let receiver = NetworkConnection(
            accepted: ScriptedStream([0x12, 0x34, 0x56, 0x78, 1, 2, 3, 4, 5], chunkSize: 1),
            parameters: .parameters { TLS() }, remote: nil)
        #expect(try await receiver.receive(as: UInt32.self).content == 0x1234_5678)
        #expect(Array(try await receiver.receive(exactly: 0).content) == [])
        #expect(Array(try await receiver.receive(exactly: 3).content) == [1, 2, 3])
        let rest = try await receiver.receive(exactly: 2)
        #expect(Array(rest.content) == [4, 5])
        let end = await #expect(throws: QXferError.self) { _ = try await receiver.receive(atLeast: 1, atMost: 10) }
        #expect(end?.code == .endOfStream)
    }

    @Test("A property list that contains itself or nests too deep is refused before decoding, not a stack overflow")
    func propertyListShape() throws {
        // An array whose only element is itself (bplist00, one object, 1-byte offsets and refs).
        let cycle: [UInt8] = Array("bplist00".utf8) + [0xA1, 0x00] + [0x08]
            + [0, 0, 0, 0, 0, 0, 0, 1, 1] + [0, 0, 0, 0, 0, 0, 0, 1] + [UInt8](repeating: 0, count: 8) + [0, 0, 0, 0, 0, 0, 0, 10]
        let refused = #expect(throws: QXferError.self) { _ = try CoderFormat.propertyList.decode(Sample.self, from: Data(cycle)) }
        #expect(refused?.code == .malformedMessage)
        #expect(refused?.description.contains("contains itself") == true, "\(String(describing: refused))")

        // Each Sample level is three containers (case, payload, array): 150 levels = 450, 200 = 600.
        func nested(_ depth: Int) -> Sample { (0..<depth).reduce(Sample.empty) { inner, _ in .nested([inner]) } }
        let deepEnough = try CoderFormat.propertyList.encode(nested(150))
        #expect(try CoderFormat.propertyList.decode(Sample.self, from: deepEnough) == nested(150))
        let tooDeep = try CoderFormat.propertyList.encode(nested(200))
        let deepError = #expect(throws: QXferError.self) { _ = try CoderFormat.propertyList.decode(Sample.self, from: tooDeep) }
        #expect(deepError?.description.contains("deeper than 512") == true, "\(String(describing: deepError))")

        let xml = #expect(throws: QXferError.self) { _ = try CoderFormat.propertyList.decode(Sample.self, from: Data("<?xml version=\"1.0\"?><plist/>".utf8)) }
        #expect(xml?.code == .malformedMessage)
    }

    /// The message type of fuzz/harness/FuzzFramers.swift.
    indirect enum Sample: Codable, Equatable {
        case hello(name: String, version: Int64, flags: [Bool])
        case chunk(id: UInt64, bytes: Data, tags: [String: Int]?)
        case nested([Sample])
        case empty
    }

    /// Every input of the framers' fuzz corpus (fuzz/corpus/framers: byte 0 the framer, byte 1
    /// the limit / 64, then the stream; crashes the fuzzer finds are added there) through a real
    /// connection, in pieces of 7 bytes: the messages come out whole and within the limit, and
    /// the connection ends cleanly or with malformed-message / truncated, never otherwise.
    @Test("The framers' fuzz corpus through a real connection: whole messages, clear errors")
    func framersCorpus() async throws {
        let corpus = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("fuzz/corpus/framers")
        let names = try FileManager.default.contentsOfDirectory(atPath: corpus.path).sorted()
        #expect(names.count >= 10)
        var messagesSeen = 0
        for name in names {
            let input = try [UInt8](Data(contentsOf: corpus.appendingPathComponent(name)))
            guard input.count >= 2 else { continue }
            let limit = Int(input[1]) * 64
            let stream = ScriptedStream(Array(input.dropFirst(2)), chunkSize: 7)
            do {
                switch input[0] % 3 {
                case 0:
                    let connection = NetworkConnection(
                        accepted: stream, parameters: .parameters { TLV(maximumMessageSize: limit) { TLS() } }, remote: nil)
                    for try await (content, _) in connection.messages {
                        #expect(content.count <= limit, "\(name)")
                        messagesSeen += 1
                    }
                default:
                    let format: CoderFormat = input[0] % 3 == 1 ? .json : .propertyList
                    let connection = NetworkConnection(
                        accepted: stream, parameters: .parameters { Coder(Sample.self, using: format, maximumMessageSize: limit) { TLS() } },
                        remote: nil)
                    for try await _ in connection.messages { messagesSeen += 1 }
                }
            } catch let error as QXferError {
                #expect([.malformedMessage, .messageTooLarge, .truncated].contains(error.code), "\(name): \(error)")
                #expect(!error.description.contains("\n"), "\(name)")
            }
        }
        #expect(messagesSeen >= 8, "the seeds hold valid messages")
    }

    /// A TLV header of type 9 announcing `length` bytes.
    @Sendable static func header(_ length: UInt32) -> [UInt8] { [0, 0, 0, 9] + withUnsafeBytes(of: length.bigEndian, Array.init) }

    @Test("Framers sharing an allowance hold at most its bytes: a message that does not fit waits, unread, until another is handed over")
    func sharedAllowance() async throws {
        let allowance = MessageAllowance(bytes: 1000)
        let parameters = NetworkParameters.parameters { TLV(maximumMessageSize: 1024, allowance: allowance) { TLS() } }
        @Sendable func connection(_ stream: some ByteStreamTransport) -> NetworkConnection<TLVStack> {
            NetworkConnection(accepted: stream, parameters: parameters, remote: nil)
        }
        let header = Self.header
        // The first peer announces 700 bytes and sends 300 of them.
        let slow = FedStream()
        slow.feed(header(700) + [UInt8](repeating: 1, count: 300))
        let first = Task { try await connection(slow).receive().content }
        try #require(await eventually { allowance.reservedBytes == 700 }, "the first body's reservation")
        // The second sends a whole message of 600 bytes: it does not fit beside the first.
        let second = Task { try await connection(ScriptedStream(header(600) + [UInt8](repeating: 2, count: 600), chunkSize: 4096)).receive().content }
        try #require(await eventually { allowance.waitingCount == 1 }, "the second message waiting")
        #expect(allowance.reservedBytes == 700)
        // A third, small enough to fit, still waits behind it: first come, first served.
        let third = Task { try await connection(ScriptedStream(header(100) + [UInt8](repeating: 3, count: 100), chunkSize: 4096)).receive().content }
        try #require(await eventually { allowance.waitingCount == 2 }, "the third message waiting")
        slow.feed([UInt8](repeating: 1, count: 400))
        #expect(try await within(.seconds(30), "the first message") { try await first.value } == Data(repeating: 1, count: 700))
        #expect(try await within(.seconds(30), "the second message") { try await second.value } == Data(repeating: 2, count: 600))
        #expect(try await within(.seconds(30), "the third message") { try await third.value } == Data(repeating: 3, count: 100))
        #expect(allowance.reservedBytes == 0 && allowance.waitingCount == 0)
    }

    @Test("A message waiting for the allowance is cancelled cleanly; one larger than the whole allowance is refused")
    func allowanceCancelAndRefuse() async throws {
        let allowance = MessageAllowance(bytes: 500)
        let header = Self.header
        let parameters = NetworkParameters.parameters { TLV(maximumMessageSize: 1024, allowance: allowance) { TLS() } }
        let held = FedStream()
        held.feed(header(400))
        let holder = Task { try await NetworkConnection(accepted: held, parameters: parameters, remote: nil).receive() }
        try #require(await eventually { allowance.reservedBytes == 400 }, "the holder's reservation")
        let waiter = Task { try await NetworkConnection(accepted: ScriptedStream(header(200) + [UInt8](repeating: 0, count: 200), chunkSize: 64), parameters: parameters, remote: nil).receive() }
        try #require(await eventually { allowance.waitingCount == 1 }, "the waiter")
        waiter.cancel()
        let error = await #expect(throws: QXferError.self) { try await waiter.value }
        #expect(error?.code == .cancelled)
        #expect(allowance.waitingCount == 0 && allowance.reservedBytes == 400)
        // Larger than the allowance can ever hold: refused as too large, not waited for.
        let tooLarge = NetworkConnection(accepted: ScriptedStream(header(600), chunkSize: 64), parameters: parameters, remote: nil)
        let refused = await #expect(throws: QXferError.self) { _ = try await tooLarge.receive() }
        #expect(refused?.code == .messageTooLarge)
        held.close()  // the holder's stream ends inside its message: truncated, and its share given back
        await #expect(throws: QXferError.self) { _ = try await holder.value }
        #expect(allowance.reservedBytes == 0)
    }
}
