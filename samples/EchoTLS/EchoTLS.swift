// An echo server and client in one program, on loopback, over TCP+TLS.
// samples/EchoQUIC/EchoQUIC.swift is the same program with one line changed: TLS() → QUIC().
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
                    while let chunk = try? await connection.receive(atLeast: 1, atMost: 1 << 20).content {
                        try await connection.send(chunk)
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
            connection.cancel()
            group.cancelAll()
        }
    }
}
