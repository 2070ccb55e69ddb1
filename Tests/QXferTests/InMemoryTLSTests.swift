import Foundation
import LinuxSystem
import NIOCore
import NIOEmbedded
import NIOSSL
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// The TLS stack's handshake and trust decisions with no socket: two `EmbeddedChannel`s
/// joined by a loop that moves bytes until both are quiet.
@Suite("TLS handshake in memory")
struct InMemoryTLSTests {
    /// Both ends after the handshake (or its failure), the channels still open.
    struct Handshaken {
        let clientResult: Result<String, any Error>?, serverResult: Result<String, any Error>?
        let clientVerifier: PeerVerifier, serverVerifier: PeerVerifier
        let clientExporter: TLSExporter?, serverExporter: TLSExporter?
        let client: EmbeddedChannel, server: EmbeddedChannel
        /// What the server's application would read from.
        let serverBridge: NIOLoopBound<InboundBridge>
    }

    func handshake(clientTLS: TLS, serverTLS: TLS, trust: PeerTrust, hostKey: String = "test.invalid:4433") throws -> Handshaken {
        let client = EmbeddedChannel()
        let server = EmbeddedChannel()
        // No finish(): closing starts TLS close_notify, which waits for a peer nobody drives.
        let clientVerifier = PeerVerifier(.client(trust, hostKey: hostKey))
        let serverVerifier = PeerVerifier(.server(serverTLS.clientAuthentication))
        let clientSecrets = ExporterSecrets(), serverSecrets = ExporterSecrets()
        let clientContext = try TLSByteStream.makeContext(
            identity: clientTLS.identity!, tls: clientTLS, role: .client, exporterSecrets: clientSecrets)
        let serverContext = try TLSByteStream.makeContext(
            identity: serverTLS.identity!, tls: serverTLS, role: .server(serverTLS.clientAuthentication), exporterSecrets: serverSecrets)
        let clientSetup = try TLSByteStream.Setup.install(
            try NIOSSLClientHandler(context: clientContext, serverHostname: nil, customVerificationCallback: clientVerifier.verify),
            accepting: clientTLS.applicationProtocols, idle: nil, exporterSecrets: (clientSecrets, isServer: false), on: client)
        let serverSetup = try TLSByteStream.Setup.install(
            NIOSSLServerHandler(context: serverContext, customVerificationCallback: serverVerifier.verify),
            accepting: serverTLS.applicationProtocols, idle: nil, exporterSecrets: (serverSecrets, isServer: true), on: server)
        let clientResult = Locked<Result<String, any Error>?>(nil)
        let serverResult = Locked<Result<String, any Error>?>(nil)
        clientSetup.handshake.whenComplete { result in clientResult.withLock { $0 = result } }
        serverSetup.handshake.whenComplete { result in serverResult.withLock { $0 = result } }

        server.pipeline.fireChannelActive()
        _ = try client.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 4433)).wait()
        // Shuttle bytes both ways until neither side has anything left to say.
        var rounds = 0
        while rounds < 100 {
            rounds += 1
            var moved = false
            // The verification callback's promise resumes the handshake through the event loop.
            client.embeddedEventLoop.run()
            server.embeddedEventLoop.run()
            while let bytes = try client.readOutbound(as: ByteBuffer.self) {
                _ = try? server.writeInbound(bytes)
                moved = true
            }
            while let bytes = try server.readOutbound(as: ByteBuffer.self) {
                _ = try? client.writeInbound(bytes)
                moved = true
            }
            if !moved { break }
        }
        return Handshaken(
            clientResult: clientResult.withLock { $0 }, serverResult: serverResult.withLock { $0 },
            clientVerifier: clientVerifier, serverVerifier: serverVerifier,
            clientExporter: clientSetup.randomObserver?.value.takeExporter(),
            serverExporter: serverSetup.randomObserver?.value.takeExporter(),
            client: client, server: server, serverBridge: serverSetup.bridge)
    }

    var serverTLS: TLS { TLS().identity(Identities.server) }
    var clientTLS: TLS { TLS().identity(Identities.client) }

    @Test("Records that arrive a few at a time wait compactly, not each pinning NIOSSL's grown read buffer")
    func recordsWaitCompactly() throws {
        let pair = try handshake(clientTLS: clientTLS, serverTLS: serverTLS, trust: .pinned(Identities.server.fingerprint))
        #expect(try pair.serverResult?.get() == "qxfer/1")
        let source = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13) }
        let piece = 16 << 10
        for offset in stride(from: 0, to: source.count, by: piece) {
            pair.client.writeAndFlush(ByteBuffer(bytes: source[offset..<min(offset + piece, source.count)]), promise: nil)
        }
        var records: [ByteBuffer] = []
        while let bytes = try pair.client.readOutbound(as: ByteBuffer.self) { records.append(bytes) }
        // A quarter in one read grows NIOSSL's plaintext buffer; then one record per read, as
        // off a long path, each handed on as a slice of a buffer that large.
        var first = ByteBuffer()
        for var record in records.prefix(records.count / 4) { first.writeBuffer(&record) }
        try pair.server.writeInbound(first)
        for record in records.dropFirst(records.count / 4) { try pair.server.writeInbound(record) }

        let buffers = try #require(try pair.serverBridge.value.next(on: pair.server.eventLoop).wait())
        let held = buffers.reduce(0) { $0 + $1.storageCapacity }
        #expect(held < 2 * source.count, "\(source.count) bytes waiting held \(held) bytes of storage")
        #expect(buffers.flatMap { $0.readableBytesView } == source)
    }

    /// Stands in for the server's socket: records the wake marks the bridge sets.
    final class MarkRecorder: WakeMarkSocket {
        var mark = 1
        var highest = 1
        func receiveBufferSize() -> Int? { 4 << 20 }
        func setWakeMark(_ bytes: Int) throws {
            mark = bytes
            highest = max(highest, bytes)
        }
    }

    @Test("A waiting reader's wake mark never asks for more than the peer still sends, however the socket splits its records",
          arguments: [1_000, 9_000, 40_000])
    func wakeMarkStaysReachable(largestRead: Int) throws {
        let pair = try handshake(clientTLS: clientTLS, serverTLS: serverTLS, trust: .pinned(Identities.server.fingerprint))
        let marks = MarkRecorder()
        let bridge = pair.serverBridge.value
        bridge.setWakeMarks(on: marks)
        var random = SplitMix64(seed: UInt64(largestRead))
        for size in [3 << 20, 70_000, 1 << 20, 50_000] {
            // The peer writes one message in pieces of any size, as an application does.
            let message = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ size) }
            var offset = 0
            while offset < size {
                let piece = min(size - offset, Int.random(in: 1...(64 << 10), using: &random))
                pair.client.writeAndFlush(ByteBuffer(bytes: message[offset..<offset + piece]), promise: nil)
                offset += piece
            }
            var wire = ByteBuffer()
            while var bytes = try pair.client.readOutbound(as: ByteBuffer.self) { wire.writeBuffer(&bytes) }

            var received: [UInt8] = []
            while received.count < size {
                let answer = bridge.next(atLeast: size - received.count, on: pair.server.eventLoop)
                let answered = Locked(false)
                answer.whenComplete { _ in answered.withLock { $0 = true } }
                // The socket hands the records on in reads of any size; a kernel would wake the
                // reader only once the mark's bytes wait, so the mark must never pass what is left.
                while !answered.withLock({ $0 }), wire.readableBytes > 0 {
                    #expect(marks.mark <= wire.readableBytes, "a mark of \(marks.mark) with \(wire.readableBytes) bytes still to come")
                    let read = wire.readSlice(length: min(wire.readableBytes, Int.random(in: 1...largestRead, using: &random)))!
                    try pair.server.writeInbound(read)
                }
                let buffers = try #require(try answer.wait())
                received += buffers.flatMap { $0.readableBytesView }
            }
            #expect(received == message)
            #expect(wire.readableBytes == 0)
        }
        // Reads of more than a record leave the mark raised for most of a large message.
        if largestRead > 20_000 { #expect(marks.highest >= 128 << 10) }
    }

    @Test("A pinned server completes the handshake, negotiates qxfer/1 and sees the client's fingerprint")
    func pinnedHandshake() throws {
        let outcome = try handshake(clientTLS: clientTLS, serverTLS: serverTLS, trust: .pinned(Identities.server.fingerprint))
        #expect(try outcome.clientResult?.get() == "qxfer/1")
        #expect(try outcome.serverResult?.get() == "qxfer/1")
        #expect(outcome.clientVerifier.result.trust == .pinned)
        #expect(outcome.clientVerifier.result.fingerprint == Identities.server.fingerprint)
        #expect(outcome.serverVerifier.result.fingerprint == Identities.client.fingerprint)
    }

    @Test("Both ends derive the same TLS exporter values; another label or context gives another value")
    func exporterAgrees() throws {
        let outcome = try handshake(clientTLS: clientTLS, serverTLS: serverTLS, trust: .pinned(Identities.server.fingerprint))
        let client = try #require(outcome.clientExporter)
        let server = try #require(outcome.serverExporter)
        let value = client.export(label: "EXPORTER-test", context: [], length: 32)
        #expect(value.count == 32)
        #expect(value == server.export(label: "EXPORTER-test", context: [], length: 32))
        #expect(value != client.export(label: "EXPORTER-other", context: [], length: 32))
        #expect(value != client.export(label: "EXPORTER-test", context: [1], length: 32))
        // A second handshake between the same identities has a secret of its own.
        let again = try handshake(clientTLS: clientTLS, serverTLS: serverTLS, trust: .pinned(Identities.server.fingerprint))
        #expect(try #require(again.clientExporter).export(label: "EXPORTER-test", context: [], length: 32) != value)
    }

    @Test("A server whose fingerprint differs from the pin is refused, naming both fingerprints")
    func wrongPin() throws {
        let outcome = try handshake(clientTLS: clientTLS, serverTLS: serverTLS, trust: .pinned(Identities.stranger.fingerprint))
        #expect(throws: (any Error).self) { try outcome.clientResult?.get() }
        let failure = try #require(outcome.clientVerifier.result.failure)
        #expect(failure.code == .fingerprintMismatch)
        #expect(failure.message.contains(Identities.server.fingerprint.description))
        #expect(failure.message.contains(Identities.stranger.fingerprint.description))
    }

    @Test("Mutual TLS admits a client on the allow-list")
    func mutualTLSAccepted() throws {
        let outcome = try handshake(
            clientTLS: clientTLS,
            serverTLS: serverTLS.clientAuthentication(.required(allowing: [Identities.client.fingerprint])),
            trust: .pinned(Identities.server.fingerprint))
        #expect(try outcome.serverResult?.get() == "qxfer/1")
        #expect(outcome.serverVerifier.result.trust == .allowListed)
    }

    @Test("Mutual TLS refuses a client that is not on the allow-list")
    func mutualTLSRefused() throws {
        let outcome = try handshake(
            clientTLS: TLS().identity(Identities.stranger),
            serverTLS: serverTLS.clientAuthentication(.required(allowing: [Identities.client.fingerprint])),
            trust: .pinned(Identities.server.fingerprint))
        #expect(throws: (any Error).self) { try outcome.serverResult?.get() }
        #expect(outcome.serverVerifier.result.failure?.code == .untrustedPeer)
    }

    @Test("A client that offers another application protocol is refused")
    func alpnMismatch() throws {
        let outcome = try handshake(
            clientTLS: clientTLS.applicationProtocols(["h2"]), serverTLS: serverTLS,
            trust: .pinned(Identities.server.fingerprint))
        let clientError = #expect(throws: QXferError.self) { try outcome.clientResult?.get() }
        #expect(clientError?.code == .protocolMismatch)
        let serverError = #expect(throws: QXferError.self) { try outcome.serverResult?.get() }
        #expect(serverError?.code == .protocolMismatch)
    }

    @Test("Known hosts: first use is allowed and pending, a match is known, a change is refused")
    func knownHostsDecisions() throws {
        let directory = TemporaryDirectory()
        let file = KnownHosts(path: directory.file("known_hosts"))
        let first = try handshake(clientTLS: clientTLS, serverTLS: serverTLS, trust: .knownHosts(file))
        #expect(try first.clientResult?.get() == "qxfer/1")
        #expect(first.clientVerifier.result.trust == .firstUse(recordedIn: file.path))
        #expect(first.clientVerifier.result.pendingFirstUse?.1 == "test.invalid:4433")

        try file.add("test.invalid:4433", Identities.server.fingerprint)
        let known = try handshake(clientTLS: clientTLS, serverTLS: serverTLS, trust: .knownHosts(file))
        #expect(known.clientVerifier.result.trust == .knownHost)

        let impostor = try handshake(clientTLS: clientTLS, serverTLS: TLS().identity(Identities.stranger), trust: .knownHosts(file))
        #expect(throws: (any Error).self) { try impostor.clientResult?.get() }
        let failure = try #require(impostor.clientVerifier.result.failure)
        #expect(failure.code == .fingerprintMismatch)
        #expect(failure.message.contains("line 1"))

        let noTOFU = try handshake(
            clientTLS: clientTLS, serverTLS: serverTLS, trust: .knownHosts(file, trustOnFirstUse: false), hostKey: "other:1")
        #expect(noTOFU.clientVerifier.result.failure?.code == .untrustedPeer)
    }
}
