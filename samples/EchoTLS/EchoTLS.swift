// An echo server and client in one program, on loopback, over TCP+TLS.
// samples/EchoQUIC/EchoQUIC.swift is the same program with one line changed: TLS() → QUIC().
// It echoes bytes on the connection, then on 16 extra streams at once, then 100 datagrams:
// on QUIC streams and datagrams share the connection; on TCP+TLS each stream is a connection
// of its own and datagrams are delivered reliably, so the same code runs with other costs.
//
//     swift run echo-tls [MEGABYTES]
import Foundation
import QXfer

@main
struct Echo {
    static func main() async {
        do {
            try await run()
        } catch {
            print("echo failed: \(error)")
            exit(1)
        }
    }

    static func run() async throws {
        let megabytes = CommandLine.arguments.dropFirst().first.flatMap(Int.init) ?? 16
        let server = try HostIdentity.ephemeral(commonName: "echo server")
        let client = try HostIdentity.ephemeral(commonName: "echo client")
        let stack = TLS()
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { stack.identity(server) }

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    try await withThrowingDiscardingTaskGroup { group in
                        group.addTask {
                            try await withThrowingDiscardingTaskGroup { streams in
                                for try await stream in connection.incomingStreams {
                                    streams.addTask { try await echo(stream) }
                                }
                            }
                        }
                        group.addTask {
                            for try await datagram in connection.datagrams { try await connection.sendDatagram(datagram) }
                        }
                        try await echo(connection)
                    }
                }
            }
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: try await listener.port)) {
                stack.identity(client).peerFingerprint(server.fingerprint)
            }
            let chunk = Data((0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
            let clock = ContinuousClock()
            let started = clock.now
            async let echoed: Int = {
                var total = 0
                while total < megabytes << 20 {
                    let part = try await connection.receive(atLeast: 1, atMost: 1 << 20).content
                    for (offset, byte) in part.enumerated() where byte != chunk[(total + offset) % chunk.count] {
                        throw QXferError(.malformedMessage, "echoed bytes differ at offset \(total + offset)")
                    }
                    total += part.count
                }
                return total
            }()
            for _ in 0..<megabytes { try await connection.send(chunk) }
            let total = try await echoed
            let seconds = Double((clock.now - started).components.attoseconds) / 1e18 + Double((clock.now - started).components.seconds)
            print("\(type(of: stack)): echoed \(total) bytes intact in \(String(format: "%.2f", seconds)) s; \(await connection.metrics)")

            // The same calls on either stack: extra streams in parallel, then datagrams.
            let streamsStarted = clock.now
            try await withThrowingTaskGroup(of: Void.self) { streams in
                for index in 0..<16 {
                    streams.addTask {
                        let stream = try await connection.openStream()
                        let payload = Data(repeating: UInt8(index), count: 64 << 10)
                        try await stream.send(payload)
                        try await stream.finish()
                        guard try await stream.receive(exactly: payload.count).content == payload else {
                            throw QXferError(.malformedMessage, "stream \(index) echoed other bytes")
                        }
                    }
                }
                try await streams.waitForAll()
            }
            print("\(type(of: stack)): 16 streams of 64 KiB echoed in \(milliseconds(clock.now - streamsStarted))")
            let datagramsStarted = clock.now
            var replies = connection.datagrams.makeAsyncIterator()
            var answered = 0
            for index in 0..<100 {
                try await connection.sendDatagram(Data("datagram \(index)".utf8))
                if try await replies.next() != nil { answered += 1 }
            }
            let limit = try await connection.maximumDatagramSize ?? 0
            print("\(type(of: stack)): \(answered) of 100 datagrams answered in \(milliseconds(clock.now - datagramsStarted)) (at most \(limit) bytes each)")
            connection.cancel()
            group.cancelAll()
        }
    }

    static func milliseconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        return String(format: "%.1f ms", Double(seconds) * 1e3 + Double(attoseconds) / 1e15)
    }

    /// Returns every byte until the peer finishes its direction, then finishes ours.
    static func echo(_ connection: NetworkConnection<some ByteStreamProtocol>) async throws {
        while let chunk = try? await connection.receive(atLeast: 1, atMost: 1 << 20).content {
            try await connection.send(chunk)
        }
        try? await connection.finish()
    }
}
