import Foundation
import LinuxSystem
import NIOCore
import NIOPosix
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// QUIC's extras on TCP+TLS: each extra stream and the datagram carrier is a child connection
/// naming its parent by an exporter token. What differs from QUIC is tested here; what does
/// not runs on both stacks in QUICStreamTests.
@Suite("TLS child streams and datagrams")
struct TLSStreamTests {
    static func listener() -> NetworkListener<TLS> {
        NetworkListener(on: 0, host: "127.0.0.1") { TLS().identity(Identities.server) }
    }

    /// Reads a stream to its end and returns how many bytes came.
    static func drain<Stack: ByteStreamProtocol>(_ stream: NetworkConnection<Stack>) async throws -> Int {
        var total = 0
        while true {
            do { total += try await stream.receive(atLeast: 1, atMost: 1 << 20).content.count }
            catch let error as QXferError where error.code == .endOfStream { return total }
        }
    }

    @Test("A stream whose reader stalls holds back only its own sender; the other streams finish meanwhile")
    func perStreamBackpressure() async throws {
        let gate = Gate()
        let sent = Counter()
        try await withListener(Self.listener(), handler: { connection in
            try await withThrowingDiscardingTaskGroup { group in
                for try await stream in connection.incomingStreams {
                    group.addTask {
                        let first = try await stream.receive(exactly: 1).content
                        if first == Data([0]) { await gate.wait() }  // stream 0's reader stalls
                        let total = try await Self.drain(stream) + 1
                        try await stream.send(Data(String(total).utf8))
                        try await stream.finish()
                    }
                }
            }
        }) { port in
            let connection = TestStack.tlsClient(port)
            try await connection.start()
            let chunk = Data(count: 1 << 20)
            let stalled = try await connection.openStream()
            let stalledSender = Task {
                try await stalled.send(Data([0]))
                for _ in 0..<64 {
                    try await stalled.send(chunk)
                    sent.add(chunk.count)
                }
                try await stalled.finish()
            }
            // Eight other streams carry 8 MiB each to the end while stream 0 is stuck.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 1...8 {
                    group.addTask {
                        let stream = try await connection.openStream()
                        try await stream.send(Data([1]))
                        for _ in 0..<8 { try await stream.send(chunk) }
                        try await stream.finish()
                        let reply = try await stream.receive(atLeast: 1, atMost: 32).content
                        #expect(String(decoding: reply, as: UTF8.self) == String(1 + 8 << 20))
                    }
                }
                try await group.waitForAll()
            }
            // TCP flow control, the socket buffers and the bridge's 1 MiB bound what stream 0
            // could push into a reader that reads nothing.
            let stalledAt = sent.value
            #expect(stalledAt < 32 << 20, "sent \(stalledAt) bytes into a reader that reads nothing")
            await gate.open()
            try await stalledSender.value
            let reply = try await stalled.receive(atLeast: 1, atMost: 32).content
            #expect(String(decoding: reply, as: UTF8.self) == String(1 + 64 << 20))
            connection.cancel()
        }
    }

    @Test("Datagrams: 1200 bytes at most; the server's go back on the client's carrier; they end when the peer closes")
    func datagramLimits() async throws {
        try await withListener(Self.listener(), handler: { connection in
            #expect(try await connection.maximumDatagramSize == TLSChildProtocol.maximumDatagramSize)
            for try await datagram in connection.datagrams {
                try await connection.sendDatagram(datagram + datagram)
                return  // the handler's end closes the connection
            }
        }) { port in
            let connection = TestStack.tlsClient(port)
            #expect(try await connection.maximumDatagramSize == 1200)
            let tooLarge = await #expect(throws: QXferError.self) { try await connection.sendDatagram(Data(count: 1201)) }
            #expect(tooLarge?.code == .invalidUse)
            try await connection.sendDatagram(Data(repeating: 7, count: 600))
            var iterator = connection.datagrams.makeAsyncIterator()
            #expect(try await iterator.next() == Data(repeating: 7, count: 1200))
            #expect(try await iterator.next() == nil)
            connection.cancel()
        }
    }

    @Test("A datagram reader that falls behind loses the oldest, keeping the newest 256")
    func datagramReaderFallsBehind() async throws {
        let inbox = DatagramInbox()
        var bytes = ByteBuffer()
        for index in 0..<300 {
            bytes.writeInteger(UInt16(4))
            bytes.writeInteger(UInt32(index))
        }
        // Delivered in pieces that split frames, as TCP may.
        while bytes.readableBytes > 0 {
            #expect(inbox.feedForTesting(bytes.readSlice(length: min(7, bytes.readableBytes))!))
        }
        var first = try #require(try await inbox.next())
        #expect(first.readInteger(as: UInt32.self) == UInt32(300 - TLSChildProtocol.incomingDatagramLimit))
        var received = 1
        inbox.finish()
        while try await inbox.next() != nil { received += 1 }
        #expect(received == TLSChildProtocol.incomingDatagramLimit)
        // A length above the limit is malformed: the carrier is closed.
        var oversize = ByteBuffer()
        oversize.writeInteger(UInt16(TLSChildProtocol.maximumDatagramSize + 1))
        #expect(!DatagramInbox().feedForTesting(oversize))
    }

    @Test("A child connection with an unknown token is refused, and one with another client's certificate too")
    func tokenRefusal() async throws {
        let handled = Counter()
        try await withListener(Self.listener(), handler: { connection in
            handled.add(1)
            for try await stream in connection.incomingStreams { stream.cancel() }
        }) { port in
            let address = try SocketAddress(ipAddress: "127.0.0.1", port: Int(port))
            let connection = TestStack.tlsClient(port)
            try await connection.start()
            let session = try #require(connection.currentTransport() as? TLSByteStream).session!
            func connector(_ identity: HostIdentity) -> TLSChildConnector {
                TLSChildConnector(
                    address: address, identity: identity, tls: TLS(), settings: SocketTuning.Settings(.parameters { TLS() }, tcp: TCP()),
                    idle: nil, serverPeer: session.peer, timeout: .seconds(10))
            }
            let unknown = await #expect(throws: QXferError.self) {
                _ = try await connector(Identities.client).connect(kind: .stream, token: Array(repeating: 0x5A, count: 16)) { _ in }
            }
            #expect(unknown?.message.contains("no longer knows this connection") == true, "\(String(describing: unknown))")
            let stranger = await #expect(throws: QXferError.self) {
                _ = try await connector(Identities.stranger).connect(kind: .stream, token: session.token) { _ in }
            }
            #expect(stranger?.message.contains("refused") == true, "\(String(describing: stranger))")
            // The rightful client with the right token is admitted.
            let child = try await connector(Identities.client).connect(kind: .stream, token: session.token) { _ in }
            child.close()
            #expect(handled.value == 1, "only the parent reached the handler")
            connection.cancel()
        }
    }

    @Test("A child whose parent's task has not run yet waits for it; an unknown token is refused once nothing is unsettled")
    func childWaitsForItsParent() async throws {
        let registry = TLSSessionRegistry()
        let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        let peer = PeerIdentity(fingerprint: nil, trust: .unauthenticated, applicationProtocol: "qxfer/1")
        let token = Array(repeating: UInt8(0x11), count: TLSChildProtocol.tokenLength)
        // Nothing accepted and unsettled: an unknown token is refused at once.
        #expect(await registry.session(for: token, on: eventLoop, timeout: .seconds(60)) == nil)
        // The parent is accepted, its task not run: the child waits, and gets it once registered.
        registry.accepted()
        let waiting = Task { await registry.session(for: token, on: eventLoop, timeout: .seconds(60)) }
        try await Task.sleep(for: .milliseconds(50))
        let parent = TLSStreamMultiplexer(server: registry, token: token, peer: peer)
        registry.settled()
        #expect(await waiting.value === parent)
        // Another accepted connection that turns out not to be the parent ends the wait.
        let other = Array(repeating: UInt8(0x22), count: TLSChildProtocol.tokenLength)
        registry.accepted()
        let unknown = Task { await registry.session(for: other, on: eventLoop, timeout: .seconds(60)) }
        try await Task.sleep(for: .milliseconds(50))
        registry.settled()
        #expect(await unknown.value == nil)
        // A connection that never settles: the wait ends at its timeout.
        registry.accepted()
        #expect(await registry.session(for: other, on: eventLoop, timeout: .milliseconds(100)) == nil)
        parent.close()
    }

    @Test("Closing the parent closes every stream and the datagram carrier, on both ends")
    func parentCloseCleansUp() async throws {
        let peers = Recorder<Bool>()
        let port = try await withListener(Self.listener(), handler: { connection in
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { for try await datagram in connection.datagrams { try await connection.sendDatagram(datagram) } }
                for try await stream in connection.incomingStreams {
                    // A stream reports the parent's peer, ALPN included, as a QUIC stream does.
                    peers.append(stream.peer == connection.peer && stream.peer?.fingerprint == Identities.client.fingerprint)
                    group.addTask {
                        try await stream.send(try await stream.receive(exactly: 1).content)
                        _ = try? await stream.receive(exactly: 1)  // held open until the parent closes
                    }
                }
            }
        }) { port in
            let connection = TestStack.tlsClient(port)
            var streams: [NetworkConnection<TLS>] = []
            for _ in 0..<10 {
                let stream = try await connection.openStream()
                try await stream.send(Data([9]))
                #expect(try await stream.receive(exactly: 1).content == Data([9]))
                streams.append(stream)
            }
            try await connection.sendDatagram(Data([1]))
            var datagrams = connection.datagrams.makeAsyncIterator()
            #expect(try await datagrams.next() == Data([1]))
            // The listener, then two ends each of the parent, 10 streams and the carrier.
            #expect(socketCount(port: port) == 1 + 2 * 12)
            #expect(peers.all == Array(repeating: true, count: 10))
            #expect(streams.allSatisfy { $0.peer == connection.peer })
            connection.cancel()
            #expect(await eventually(timeout: .seconds(10)) { socketCount(port: port) == 1 }, "sockets left: \(socketCount(port: port))")
            for stream in streams {
                #expect(await qxferError { _ = try await stream.receive(exactly: 1) } != nil)
            }
            return port
        }
        #expect(await eventually(timeout: .seconds(10)) { socketCount(port: port) == 0 })
    }

    @Test("Past 128 open streams, openStream() waits until one closes, as on QUIC")
    func streamLimitWaits() async throws {
        let accepted = Counter()
        try await withListener(Self.listener(), handler: { connection in
            try await withThrowingDiscardingTaskGroup { group in
                for try await stream in connection.incomingStreams {
                    accepted.add(1)
                    group.addTask { _ = try? await stream.receive(exactly: 1) }  // open until the client closes it
                }
            }
        }) { port in
            let connection = TestStack.tlsClient(port)
            var streams: [NetworkConnection<TLS>] = []
            for _ in 0..<TLSChildProtocol.maximumStreams { streams.append(try await connection.openStream()) }
            #expect(await eventually { accepted.value == TLSChildProtocol.maximumStreams })
            let extra = Task { try await connection.openStream() }
            try await Task.sleep(for: .milliseconds(300))
            #expect(accepted.value == TLSChildProtocol.maximumStreams, "the listener admitted a stream past its limit")
            streams[0].cancel()
            let opened = try await extra.value
            #expect(await eventually { accepted.value == TLSChildProtocol.maximumStreams + 1 })
            try await opened.send(Data([1]))
            connection.cancel()
        }
    }

    @Test("reset() on a stream aborts it: the peer's read fails instead of ending cleanly; the parent lives on")
    func resetAbortsStream() async throws {
        let outcome = Locked<String?>(nil)
        try await withListener(Self.listener(), handler: { connection in
            for try await stream in connection.incomingStreams {
                _ = try await stream.receive(exactly: 3)
                try await stream.send(Data("got".utf8))
                do {
                    _ = try await stream.receive(exactly: 1)
                    outcome.withLock { $0 = "read more" }
                } catch let error as QXferError {
                    outcome.withLock { $0 = error.code.name }
                }
                try await connection.send(Data("after".utf8))
            }
        }) { port in
            let connection = TestStack.tlsClient(port)
            let stream = try await connection.openStream()
            try await stream.send(Data("abc".utf8))
            #expect(try await stream.receive(exactly: 3).content == Data("got".utf8))
            stream.reset(errorCode: 7)
            #expect(try await connection.receive(exactly: 5).content == Data("after".utf8))
            let code = outcome.withLock { $0 }
            #expect(code != nil && code != "end-of-stream" && code != "read more", "the server saw \(String(describing: code))")
            connection.cancel()
        }
    }

    @Test("close(errorCode:) on an extra stream closes the whole connection, as on QUIC")
    func closeFromStream() async throws {
        try await withListener(Self.listener(), handler: { connection in
            for try await stream in connection.incomingStreams { _ = try? await stream.receive(exactly: 1) }
        }) { port in
            let connection = TestStack.tlsClient(port)
            let stream = try await connection.openStream()
            #expect(socketCount(port: port) == 1 + 2 * 2)
            stream.close(errorCode: 9, reason: "done")
            #expect(await eventually(timeout: .seconds(10)) { socketCount(port: port) == 1 }, "sockets left: \(socketCount(port: port))")
            #expect(await qxferError { _ = try await connection.receive(exactly: 1) } != nil)
            connection.cancel()
        }
    }

    @Test("On TLS only the client opens streams; a client's incoming streams end when the connection closes")
    func serverCannotOpenStreams() async throws {
        let refusal = Locked<QXferError?>(nil)
        try await withListener(Self.listener(), handler: { connection in
            do { _ = try await connection.openStream() } catch let error as QXferError { refusal.withLock { $0 = error } }
            try await connection.send(Data([1]))
            _ = try? await connection.receive(exactly: 1)
        }) { port in
            let connection = TestStack.tlsClient(port)
            #expect(try await connection.receive(exactly: 1).content == Data([1]))
            #expect(refusal.withLock { $0?.code } == .unsupported)
            let session = try #require((connection.currentTransport() as? TLSByteStream)?.session)
            let incoming = Task { try await session.acceptStream() == nil }
            connection.cancel()
            #expect(try await incoming.value)
        }
    }
}

extension DatagramInbox {
    /// Feeds bytes as the carrier's event loop would.
    func feedForTesting(_ bytes: ByteBuffer) -> Bool { feed(bytes) }
}
