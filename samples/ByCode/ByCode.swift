// Two programs that cannot dial each other (each behind its own NAT) meet by a code through a
// relay, then talk over an ordinary connection pinned to the certificate the code proved.
// The path under it is direct where hole punching opens one, else through the relay.
//
//     qxfer relay --port 7450                                    # on a host both can reach
//     swift run qxfer-bycode send "hello there" --relay HOST     # prints a code
//     swift run qxfer-bycode receive 7-apple-river-stone --relay HOST
//
// With no --relay, both must be on one network (the sender advertises its room by mDNS).
// Swapping the transport is the one line marked below: QUIC() ↔ TLS().
import Foundation
import QXfer
import QXferReach

@main
struct ByCode {
    static func main() async {
        do {
            try await run(Array(CommandLine.arguments.dropFirst()))
        } catch {
            print("bycode: \(error)")
            exit(1)
        }
    }

    static func run(_ arguments: [String]) async throws {
        guard arguments.count >= 2 else {
            print("usage: qxfer-bycode send MESSAGE [--relay HOST[:PORT]] | receive CODE [--relay HOST[:PORT]]")
            exit(64)
        }
        var place = MeetingPlace.localNetwork
        if let flag = arguments.firstIndex(of: "--relay"), flag + 1 < arguments.count {
            guard let relay = RelayAddress(parsing: arguments[flag + 1]) else { throw QXferError(.invalidUse, "not a relay address") }
            place = .relay(relay)
        }
        let identity = try HostIdentity.ephemeral(commonName: "bycode")
        // The meeting's paths reach the peer through a local port: QUIC treats it as a tunnel.
        let stack = QUIC().tunnelledThroughLoopback()  // ← or TLS()

        switch arguments[0] {
        case "send":
            try await CodeMeeting.offering(at: place, announce: { code in
                // Unbuffered: the person (or script) at the other end needs the line now.
                FileHandle.standardOutput.write(Data("code: \(code)\n".utf8))
            }) { meeting in
                let receiver = try await meeting.authenticatePeer(over: stack, identity: identity, name: "bycode sender")
                let connection = NetworkConnection(to: try await meeting.endpoint(for: .transfer)) {
                    stack.identity(identity).peerFingerprint(receiver.fingerprint)
                }
                try await connection.send(Data(arguments[1].utf8))
                try await connection.finish()
                let answer = try await connection.receive(exactly: 2).content
                await connection.close(within: .seconds(1))
                print("the receiver answered '\(String(decoding: answer, as: UTF8.self))'; path: \(meeting.path)")
            }
        case "receive":
            guard let code = TransferCode(parsing: arguments[1]) else { throw QXferError(.invalidUse, "not a code: \(TransferCode.form)") }
            try await CodeMeeting.answering(code, at: place) { meeting in
                let sender = try await meeting.awaitPeer(identity: identity, name: "bycode receiver")
                // Only the sender the code proved is admitted.
                let listener = NetworkListener(on: 0, host: "127.0.0.1") {
                    stack.identity(identity).clientAuthentication(.required(allowing: [sender.fingerprint]))
                }
                let (messages, received) = AsyncStream.makeStream(of: Data.self)
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask {
                        try await listener.run { connection in
                            var message = Data()
                            while let part = try? await connection.receive(atLeast: 1, atMost: 1 << 16).content { message += part }
                            try await connection.send(Data("ok".utf8))
                            try? await connection.finish()
                            received.yield(message)
                            _ = try? await connection.receive(exactly: 1)  // until the sender, answered, closes
                        }
                    }
                    meeting.serve(.transfer, onLocalPort: try await listener.port)
                    for await message in messages {
                        print("received '\(String(decoding: message, as: UTF8.self))'; path: \(meeting.path)")
                        break
                    }
                    group.cancelAll()
                }
            }
        default:
            print("usage: qxfer-bycode send MESSAGE [--relay HOST[:PORT]] | receive CODE [--relay HOST[:PORT]]")
            exit(64)
        }
    }
}
