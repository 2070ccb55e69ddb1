// A tour of the connection API on loopback: a listener and its clients over TCP+TLS.
//
//     swift run qxfer-demo
//
// Identities are created in memory and known hosts go to a temporary file, so the demo
// never touches your configuration folder.
import Foundation
import QXfer

/// The messages of a tiny request/reply protocol, carried by `Coder`.
enum Note: Codable, Sendable {
    case hello(name: String)
    case welcome(message: String, connections: Int)
}

@main
struct LoopbackDemo {
    static func main() async throws {
        let receiverIdentity = try HostIdentity.ephemeral(commonName: "demo receiver")
        let senderIdentity = try HostIdentity.ephemeral(commonName: "demo sender")
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("qxfer-demo-\(getpid())")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }
        let knownHosts = KnownHosts(path: scratch.appendingPathComponent("known_hosts").path)

        // The receiver: mutual TLS, admitting only the sender's fingerprint.
        let served = Counter()
        let notes = NetworkListener(on: 0, host: "127.0.0.1") {
            Coder(Note.self, using: .json) {
                TLS().identity(receiverIdentity).clientAuthentication(.required(allowing: [senderIdentity.fingerprint]))
            }
        }
        let bulk = NetworkListener(on: 0, host: "127.0.0.1") {
            TLS().identity(receiverIdentity)
        }
        let bulkQUIC = NetworkListener(on: 0, host: "127.0.0.1") {
            QUIC().identity(receiverIdentity)  // the one-line swap
        }

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await notes.run { connection in
                    for try await note in connection.messages {
                        if case .hello(let name) = note {
                            let count = served.increment()
                            try await connection.send(.welcome(message: "hello \(name), I am the receiver", connections: count))
                        }
                    }
                }
            }
            group.addTask { try await bulk.run(countBytes) }
            group.addTask { try await bulkQUIC.run(countBytes) }
            let notesPort = try await notes.port
            let bulkPort = try await bulk.port
            print("receiver  listening on 127.0.0.1:\(notesPort) (messages) and :\(bulkPort) (bytes), TLS 1.3, ALPN qxfer/1; QUIC on UDP :\(try await bulkQUIC.port)")
            print("receiver  fingerprint \(receiverIdentity.fingerprint)")
            print("sender    fingerprint \(senderIdentity.fingerprint)")

            // 1. First contact: trust on first use records the receiver in known hosts.
            let peer = Endpoint.hostPort(host: "127.0.0.1", port: notesPort)
            let first = NetworkConnection(to: peer) {
                Coder(Note.self, using: .json) { TLS().identity(senderIdentity).peerTrust(.knownHosts(knownHosts)) }
            }
            try await first.send(.hello(name: "sender"))
            let reply = try await first.receive()
            print("\n1. first contact: sent .hello, received \(reply)")
            print("   trust: \(first.peer!.trust) — \(first.peer!.fingerprint!)")
            first.cancel()

            // 2. Second contact: the known-hosts entry matches.
            let second = NetworkConnection(to: peer) {
                Coder(Note.self, using: .json) { TLS().identity(senderIdentity).peerTrust(.knownHosts(knownHosts)) }
            }
            try await second.send(.hello(name: "sender again"))
            print("2. second contact: received \(try await second.receive()); trust: \(second.peer!.trust)")
            second.cancel()

            // 3. A pinned fingerprint that does not match: a loud refusal before any data flows.
            let impostorPin = try HostIdentity.ephemeral().fingerprint
            let refused = NetworkConnection(to: peer, using: .parameters {
                Coder(Note.self, using: .json) { TLS().identity(senderIdentity) }
            }.peerFingerprint(impostorPin))
            do {
                try await refused.send(.hello(name: "nobody"))
                print("3. UNEXPECTED: the wrong pin was accepted")
            } catch let error as QXferError {
                print("3. wrong pin refused [\(error.code)]: \(error.message)")
            }

            // 4. A sender the receiver does not know: mutual TLS refuses it.
            let stranger = NetworkConnection(to: peer) {
                Coder(Note.self, using: .json) { TLS().identity(try! HostIdentity.ephemeral()).peerTrust(.knownHosts(knownHosts)) }
            }
            do {
                try await stranger.send(.hello(name: "stranger"))
                _ = try await stranger.receive()
                print("4. UNEXPECTED: the stranger was admitted")
            } catch let error as QXferError {
                print("4. unknown sender refused [\(error.code)]: \(error.message)")
            }

            // 5. Bytes: 256 MiB on a byte stream, with backpressure and the path's metrics.
            try await sendBulk(label: "5. TLS ", NetworkConnection(to: .hostPort(host: "127.0.0.1", port: bulkPort), using: .parameters {
                TLS().identity(senderIdentity).peerFingerprint(receiverIdentity.fingerprint)
            }.performanceMode(.bulk)))

            // 6. The same program over QUIC: only the stack line differs.
            try await sendBulk(label: "6. QUIC", NetworkConnection(to: .hostPort(host: "127.0.0.1", port: try await bulkQUIC.port), using: .parameters {
                QUIC().identity(senderIdentity).peerFingerprint(receiverIdentity.fingerprint)
            }.performanceMode(.bulk)))

            group.cancelAll()
        }
        print("\ndone: listeners stopped, every connection closed")
    }
}

/// The receiving side of steps 5 and 6: counts bytes until the sender finishes, then replies
/// with the total as a UInt64 in network byte order.
@Sendable func countBytes<Stack: ByteStreamProtocol>(_ connection: NetworkConnection<Stack>) async throws {
    var total: UInt64 = 0
    while true {
        do {
            total += UInt64(try await connection.receive(atLeast: 1, atMost: 1 << 20).content.count)
        } catch let error as QXferError where error.code == .endOfStream {
            break
        }
    }
    var reply = total.bigEndian
    try await connection.send(Data(bytes: &reply, count: 8))
}

/// Sends 256 MiB, finishes, and prints the receiver's count, the rate and the path's metrics.
func sendBulk<Stack: ByteStreamProtocol>(label: String, _ connection: NetworkConnection<Stack>) async throws {
    let chunk = Data(repeating: 0x5a, count: 1 << 20)
    let clock = ContinuousClock()
    let started = clock.now
    for _ in 0..<256 { try await connection.send(chunk) }
    let metrics = await connection.metrics  // while the path is still open
    try await connection.finish()
    let total = try await connection.receive(as: UInt64.self).content
    let elapsed = clock.now - started
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    print(String(format: "%@: sent 256 MiB, the receiver counted %llu bytes, %.0f MB/s", label, total, Double(total) / seconds / 1e6))
    print("   metrics: \(metrics)")
    connection.cancel()
}

/// A thread-safe counter for the listener's child tasks.
final class Counter: Sendable {
    private let value = Mutex(0)
    func increment() -> Int { value.withLock { $0 += 1; return $0 } }
}

import Synchronization
