import Foundation
import LinuxSystem
import NIOCore
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// The stacks that stack-agnostic stream and datagram tests run on.
enum TestStack: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case quic, tls
    var testDescription: String { rawValue }

    /// A TLS client pinned to the test server.
    static func tlsClient(_ port: UInt16) -> NetworkConnection<TLS> {
        NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
            TLS().identity(Identities.client).peerFingerprint(Identities.server.fingerprint)
        }
    }
}

/// QUIC's extras through the public API: many streams, datagrams, bounded memory, closing.
/// The stack-agnostic ones run on TCP+TLS too, where child connections carry them.
@Suite("QUIC streams and datagrams")
struct QUICStreamTests {
    func client(_ port: UInt16, _ parameters: (NetworkParameters<QUIC>) -> NetworkParameters<QUIC> = { $0 }) -> NetworkConnection<QUIC> {
        NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port), using: parameters(.parameters {
            QUIC().identity(Identities.client).peerFingerprint(Identities.server.fingerprint)
        }))
    }

    /// Counts bytes until the client finishes, then replies with the count as text.
    static let countBytes: @Sendable (NetworkConnection<QUIC>) async throws -> Void = { connection in
        var total = 0
        while true {
            do { total += try await connection.receive(atLeast: 1, atMost: 1 << 20).content.count }
            catch let error as QXferError where error.code == .endOfStream { break }
        }
        try await connection.send(Data(String(total).utf8))
    }

    @Test("100 streams in parallel each echo their own bytes back", arguments: TestStack.allCases)
    func parallelStreams(on stack: TestStack) async throws {
        switch stack {
        case .quic:
            try await Self.parallelStreams(
                NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }, client: { client($0) })
        case .tls:
            try await Self.parallelStreams(
                NetworkListener(on: 0, host: "127.0.0.1") { TLS().identity(Identities.server) }, client: { TestStack.tlsClient($0) })
        }
    }

    static func parallelStreams<Stack: ByteStreamProtocol>(
        _ listener: NetworkListener<Stack>, client: @escaping @Sendable (UInt16) -> NetworkConnection<Stack>
    ) async throws {
        try await withListener(listener, handler: { connection in
            try await withThrowingDiscardingTaskGroup { group in
                for try await stream in connection.incomingStreams {
                    group.addTask {
                        var received = Data()
                        while true {
                            do { received += try await stream.receive(atLeast: 1, atMost: 65536).content }
                            catch let error as QXferError where error.code == .endOfStream { break }
                        }
                        try await stream.send(received)
                        try await stream.finish()
                    }
                }
            }
        }) { port in
            let connection = client(port)
            try await connection.start()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<100 {
                    group.addTask {
                        let stream = try await connection.openStream()
                        let payload = Data((0..<(4096 + index * 37)).map { UInt8(truncatingIfNeeded: $0 ^ index) })
                        try await stream.send(payload)
                        try await stream.finish()
                        let echoed = try await stream.receive(exactly: payload.count).content
                        #expect(echoed == payload, "stream \(index)")
                        let end = await #expect(throws: QXferError.self) { _ = try await stream.receive(atLeast: 1, atMost: 1) }
                        #expect(end?.code == .endOfStream)
                    }
                }
                try await group.waitForAll()
            }
            connection.cancel()
        }
    }

    @Test("Datagrams arrive intact (unreliably on QUIC, reliably and in order on TLS), and oversize ones are refused",
          arguments: TestStack.allCases)
    func datagrams(on stack: TestStack) async throws {
        switch stack {
        case .quic:
            try await Self.datagrams(
                NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }, client: { client($0) })
        case .tls:
            try await Self.datagrams(
                NetworkListener(on: 0, host: "127.0.0.1") { TLS().identity(Identities.server) }, client: { TestStack.tlsClient($0) })
        }
    }

    static func datagrams<Stack: ByteStreamProtocol>(
        _ listener: NetworkListener<Stack>, client: @escaping @Sendable (UInt16) -> NetworkConnection<Stack>
    ) async throws {
        let isReliable = !listener.parameters.stack.transport.hasIndependentStreams
        try await withListener(listener, handler: { connection in
            for try await datagram in connection.datagrams {
                try await connection.sendDatagram(datagram)
            }
        }) { port in
            let connection = client(port)
            try await connection.start()
            let maximum = try #require(try await connection.maximumDatagramSize)
            #expect(maximum > 1000 && maximum < 1500)
            // The limit can grow as the path is validated, so refuse something no path carries.
            await #expect(throws: QXferError.self) { try await connection.sendDatagram(Data(count: 65536)) }
            var echoed: [Data] = []
            var iterator = connection.datagrams.makeAsyncIterator()
            for index in 0..<50 {
                let payload = Data("datagram \(index)".utf8) + Data(count: index * 10)
                try await connection.sendDatagram(payload)
                if let back = try await iterator.next() { echoed.append(back) }
            }
            if isReliable {
                // TCP+TLS: nothing is lost, and everything arrives in order.
                #expect(echoed == (0..<50).map { Data("datagram \($0)".utf8) + Data(count: $0 * 10) })
            } else {
                // Loopback loses nothing in practice; what came back must be exactly what was sent.
                #expect(Set(echoed).count >= 45)
                for datagram in echoed { #expect(datagram.starts(with: Data("datagram ".utf8))) }
            }
            connection.cancel()
        }
    }

    @Test("A reader that does not read stalls the sender: memory stays bounded")
    func slowReaderBoundsMemory() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        let gate = Gate()
        try await withListener(listener, handler: { connection in
            _ = try await connection.receive(exactly: 1)
            await gate.wait()  // read nothing more until the test says so
            var total = 1
            while true {
                do { total += try await connection.receive(atLeast: 1, atMost: 1 << 20).content.count }
                catch let error as QXferError where error.code == .endOfStream { break }
            }
            try await connection.send(Data(String(total).utf8))
        }) { port in
            let connection = client(port)
            let sent = Counter()
            let chunk = Data(count: 1 << 20)
            let sender = Task {
                try await connection.send(Data([1]))
                for _ in 0..<64 {
                    try await connection.send(chunk)
                    sent.add(chunk.count)
                }
                try await connection.finish()
            }
            try await Task.sleep(for: .seconds(2))
            let stalledAt = sent.value
            // Flow control (stream window 6 MiB at most) plus the engine's 1 MiB send buffer
            // bound what can be in flight while the reader sleeps.
            #expect(stalledAt <= 10 << 20, "sent \(stalledAt) bytes into a reader that reads nothing")
            await gate.open()
            try await sender.value
            let reply = try await connection.receive(atLeast: 1, atMost: 32).content
            #expect(String(decoding: reply, as: UTF8.self) == String(1 + 64 << 20))
            connection.cancel()
        }
    }

    @Test("What a sender wrote less what its connection reports unacknowledged never exceeds what reached the peer; nothing is left once the peer has read all",
          arguments: TestStack.allCases)
    func unacknowledgedBytes(on stack: TestStack) async throws {
        switch stack {
        case .quic:
            try await Self.unacknowledgedBytes(
                NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }, client: { client($0) })
        case .tls:
            try await Self.unacknowledgedBytes(
                NetworkListener(on: 0, host: "127.0.0.1") { TLS().identity(Identities.server) }, client: { TestStack.tlsClient($0) })
        }
    }

    /// On an extra stream, as a sender's files travel: on TCP+TLS a connection of its own,
    /// which the parent's figure must include.
    static func unacknowledgedBytes<Stack: ByteStreamProtocol>(
        _ listener: NetworkListener<Stack>, client: @escaping @Sendable (UInt16) -> NetworkConnection<Stack>
    ) async throws {
        let gate = Gate()
        let receiving = Recorder<NetworkConnection<Stack>>()
        try await withListener(listener, handler: { connection in
            try await withThrowingDiscardingTaskGroup { group in
                for try await stream in connection.incomingStreams {
                    receiving.append(stream)
                    group.addTask {
                        await gate.wait()  // read nothing until the test says so
                        var total = 0
                        while true {
                            do { total += try await stream.receive(atLeast: 1, atMost: 1 << 20).content.count }
                            catch let error as QXferError where error.code == .endOfStream { break }
                        }
                        try await stream.send(Data(String(total).utf8))
                        try await stream.finish()
                    }
                }
            }
        }) { port in
            let connection = client(port)
            try await connection.start()
            defer { connection.cancel() }
            let stream = try await connection.openStream()
            let written = Counter()
            let chunk = Data(count: 256 << 10)
            let writer = Task {
                for _ in 0..<256 {
                    try await stream.send(chunk)
                    written.add(chunk.count)
                }
                try await stream.finish()
            }
            // Until the writes stall: the peer's windows and the transport's buffers are full
            // (on a loaded machine the first write may take a while). 200 ms without a write is
            // a stall only with bytes still unacknowledged: under CI's load a writer merely
            // slow had all it wrote acknowledged (run 45, TCP+TLS).
            var wrote = 0
            var unacknowledged = 0
            for _ in 0..<150 {
                try await Task.sleep(for: .milliseconds(200))
                let now = written.value
                if now > 0 && now == wrote {
                    unacknowledged = try #require(await connection.metrics.bytesUnacknowledged)
                    if unacknowledged > 0 { break }
                }
                wrote = now
            }
            let peer = try #require(receiving.all.first)
            let arrived = try #require(await peer.metrics.bytesReceived)
            #expect(wrote > 0 && unacknowledged > 0)
            #expect(wrote - unacknowledged <= arrived,
                    "wrote \(wrote), \(unacknowledged) unacknowledged, but only \(arrived) bytes reached the peer")
            await gate.open()
            try await writer.value
            let reply = try await stream.receive(atLeast: 1, atMost: 32).content
            #expect(String(decoding: reply, as: UTF8.self) == String(64 << 20))
            var left = await connection.metrics.bytesUnacknowledged
            for _ in 0..<500 where left != 0 {  // the acknowledgements may still be on their way
                try await Task.sleep(for: .milliseconds(20))
                left = await connection.metrics.bytesUnacknowledged
            }
            #expect(left == 0)
        }
    }

    /// A client with a short idle timeout that has sent its server one byte. QUIC's idle timeout
    /// also bounds silence during the handshake (RFC 9000 §10.1), and a loaded machine (sanitizers
    /// beside every suite) can take longer than that to answer one: such an attempt ends with
    /// idle-timeout before the test has begun, so a fresh connection is tried, three at most.
    func connectedClient(_ port: UInt16, idleTimeout: Duration) async throws -> NetworkConnection<QUIC> {
        var attempt = 1
        while true {
            let connection = client(port) { $0.idleTimeout(idleTimeout) }
            do {
                try await connection.send(Data("x".utf8))
                return connection
            } catch let error as QXferError where error.code == .idleTimeout && attempt < 3 {
                attempt += 1
            }
        }
    }

    @Test("An idle QUIC connection times out with a clear error")
    func idleTimeout() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        try await withListener(listener, handler: { connection in
            _ = try? await connection.receive(atLeast: 1, atMost: 10)
            // Held open (until the test ends) longer than any idle period: the client's error
            // must be its own timeout, never this side closing.
            try? await Task.sleep(for: .seconds(180))
        }) { port in
            let connection = try await connectedClient(port, idleTimeout: .seconds(2))
            // When the timer fires is proved on simulated time (QUICEngineTests' LifecycleTests);
            // here, that the connection ends with that error instead of hanging.
            let error = try await within(.seconds(120), "an idle connection's end") {
                await qxferError { _ = try await connection.receive(atLeast: 1, atMost: 1) }
            }
            #expect(error?.code == .idleTimeout)
        }
    }

    @Test("A peer that vanishes ends the connection with an idle-timeout error, not a hang")
    func vanishedPeer() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        try await withListener(listener, handler: { connection in
            while true { try await connection.send(try await connection.receive(atLeast: 1, atMost: 100).content) }
        }) { port in
            let relay = try await UDPRelay.start(to: try SocketAddress(ipAddress: "127.0.0.1", port: Int(port)))
            let connection = try await connectedClient(relay.port, idleTimeout: .seconds(3))
            _ = try await connection.receive(exactly: 1)
            relay.blackhole()
            // As above: the end's timing on simulated time, its happening here (a loaded CI
            // machine once took 27.7 s for this 3 s timeout, as its timers ran late).
            let error = try await within(.seconds(120), "the end of a connection whose peer vanished") {
                await qxferError { _ = try await connection.receive(atLeast: 1, atMost: 1) }
            }
            #expect(error?.code == .idleTimeout)
            await relay.stop()
        }
    }

    @Test("A transfer survives the client's address changing mid-way (NAT rebinding)")
    func natRebinding() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        try await withListener(listener, handler: Self.countBytes) { port in
            let relay = try await UDPRelay.start(to: try SocketAddress(ipAddress: "127.0.0.1", port: Int(port)))
            let connection = client(relay.port)
            let states = Task { var seen: [String] = []; for await state in connection.states { seen.append("\(state)") }; return seen }
            let chunk = Data(count: 256 << 10)
            for index in 0..<64 {
                try await connection.send(chunk)
                if index == 16 || index == 40 { try await relay.rebind() }  // the server now sees a new source port
            }
            try await connection.finish()
            let reply = try await connection.receive(atLeast: 1, atMost: 32).content
            #expect(String(decoding: reply, as: UTF8.self) == String(64 * chunk.count))
            connection.cancel()
            let seen = await states.value
            #expect(!seen.contains { $0.hasPrefix("failed") }, "states: \(seen)")
            await relay.stop()
        }
    }

    @Test("A client moves to a new local port, then a new local address, mid-transfer (migration)")
    func clientMigration() async throws {
        let listener = NetworkListener(on: 0) { QUIC().identity(Identities.server) }
        try await withListener(listener, handler: Self.countBytes) { port in
            let connection = client(port)
            let chunk = Data(count: 256 << 10)
            for index in 0..<64 {
                try await connection.send(chunk)
                if index == 16 { try await connection.migrate() }  // a new port
                if index == 40 { try await connection.migrate(localHost: "127.0.0.2") }  // a new address
            }
            try await connection.finish()
            let reply = try await connection.receive(atLeast: 1, atMost: 32).content
            #expect(String(decoding: reply, as: UTF8.self) == String(64 * chunk.count))
            connection.cancel()
        }
    }

    @Test("A server that lost the connection (restarted) answers with a stateless reset: the client fails at once")
    func statelessReset() async throws {
        let first = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        let second = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        try await withListener(first, handler: echoUntilFinished) { firstPort in
            try await withListener(second, handler: echoUntilFinished) { secondPort in
                let relay = try await UDPRelay.start(to: try SocketAddress(ipAddress: "127.0.0.1", port: Int(firstPort)))
                let connection = client(relay.port) { $0.idleTimeout(.seconds(30)) }
                try await connection.send(Data("one".utf8))
                _ = try await connection.receive(exactly: 3)
                relay.retarget(to: try SocketAddress(ipAddress: "127.0.0.1", port: Int(secondPort)))
                let clock = ContinuousClock()
                let started = clock.now
                let error = await #expect(throws: QXferError.self) {
                    // Large enough that a reset (which must be shorter than its trigger) fits.
                    try await connection.send(Data(count: 200))
                    _ = try await connection.receive(exactly: 200)
                }
                #expect(error?.message.contains("stateless reset") == true, "\(String(describing: error))")
                #expect(clock.now - started < .seconds(20))
                await relay.stop()
            }
        }
    }

    @Test("A stream the peer reset while nobody was reading fails the next read with the reset, never a clean end")
    func resetWhileNobodyReads() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        let checked = Gate()
        try await withListener(listener, handler: { connection in
            for try await stream in connection.incomingStreams {
                #expect(try await stream.receive(exactly: 5).content == Data("hello".utf8))
                try await stream.send(Data("k".utf8))
                // The reset arrives (and the engine forgets the stream) before the next read.
                try await Task.sleep(for: .milliseconds(600))
                let error = await #expect(throws: QXferError.self) { _ = try await stream.receive(atLeast: 1, atMost: 100) }
                #expect(error?.code == .connectionClosed && error?.message.contains("abandoned the stream (error 7)") == true, "\(String(describing: error))")
                await checked.open()
                return
            }
        }) { port in
            let connection = client(port)
            try await connection.start()
            let stream = try await connection.openStream()
            try await stream.send(Data("hello".utf8))
            _ = try await stream.receive(exactly: 1)  // read there: the stream is the peer's
            stream.reset(errorCode: 7)
            await checked.wait()
            connection.cancel()
        }
    }

    @Test("An application close carries its code and reason to the peer, after the last reply")
    func applicationClose() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        try await withListener(listener, handler: { connection in
            _ = try await connection.receive(exactly: 5)
            try await connection.send(Data("last words".utf8))
            connection.close(errorCode: 0x42, reason: "shutting down")
        }) { port in
            let connection = client(port)
            try await connection.send(Data("hello".utf8))
            #expect(try await connection.receive(exactly: 10).content == Data("last words".utf8))
            let error = await #expect(throws: QXferError.self) { _ = try await connection.receive(atLeast: 1, atMost: 1) }
            #expect(error?.code == .connectionClosed)
            #expect(error?.message.contains("error 66") == true && error?.message.contains("shutting down") == true, "\(String(describing: error))")
        }
    }

    @Test("A close awaited before the program exits has left with the last reply: the peer learns of it even if nothing gets through afterwards")
    func awaitedCloseLeavesBeforeReturning() async throws {
        let relayed = Locked<UDPRelay?>(nil)
        let closed = Gate()
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Identities.server) }
        try await withListener(listener, handler: { connection in
            _ = try await connection.receive(exactly: 1)
            try await connection.send(Data("last words".utf8))
            // The reply is acknowledged one round trip later; only then may the close go.
            await connection.close(errorCode: 0x42, reason: "exiting", within: .seconds(20))
            // As if the process exited: nothing reaches it now, and only what it sent so far leaves.
            relayed.withLock { $0 }?.serverExits(inFlightFor: .seconds(2))
            await closed.open()
        }) { port in
            let relay = try await UDPRelay.start(to: try SocketAddress(ipAddress: "127.0.0.1", port: Int(port)))
            relayed.withLock { $0 = relay }
            relay.delay(.milliseconds(20))
            let connection = try await connectedClient(relay.port, idleTimeout: .seconds(30))
            #expect(try await connection.receive(exactly: 10).content == Data("last words".utf8))
            await closed.wait()
            // A close that returned before the close left would wait for an acknowledgement
            // that can no longer arrive, and this read would end only with the idle timeout.
            let error = await #expect(throws: QXferError.self) { _ = try await connection.receive(atLeast: 1, atMost: 1) }
            #expect(error?.code == .connectionClosed, "\(String(describing: error))")
            #expect(error?.message.contains("error 66") == true && error?.message.contains("exiting") == true, "\(String(describing: error))")
            await relay.stop()
        }
    }
}

/// Opens once; waiters resume then.
actor Gate {
    private var isOpen = false
    private var waiters: [CheckedContinuation<Void, Never>] = []
    func wait() async {
        if isOpen { return }
        await withCheckedContinuation { waiters.append($0) }
    }
    func open() {
        isOpen = true
        for waiter in waiters { waiter.resume() }
        waiters.removeAll()
    }
}

/// A thread-safe byte counter.
final class Counter: Sendable {
    private let total = Locked(0)
    func add(_ count: Int) { total.withLock { $0 += count } }
    var value: Int { total.withLock { $0 } }
}
