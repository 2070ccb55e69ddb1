import Foundation
import QXfer
import QXferPairing
import Testing

/// A fresh configuration folder with its own identity, removed by `cleanup()`.
struct Machine {
    let folder: String
    let config: ConfigDirectory
    let identity: HostIdentity
    var store: PairedDevices { PairedDevices(in: config, identity: identity) }

    init() throws {
        var template = Array((NSTemporaryDirectory() + "/qxfer-pairing-XXXXXX").utf8CString)
        let result = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        folder = String(cString: try #require(result))
        config = ConfigDirectory(path: folder + "/config")
        identity = try HostIdentity.loadOrCreate(in: config)
    }

    func cleanup() { try? FileManager.default.removeItem(atPath: folder) }
}

struct PairedDevicesTests {
    @Test func addListMarkSeenRemove() throws {
        let machine = try Machine()
        defer { machine.cleanup() }
        let other = try HostIdentity.ephemeral()
        let store = machine.store
        #expect(try store.devices().isEmpty)
        try store.add(.init(name: "laptop", fingerprint: other.fingerprint, pairedAt: Date(), address: "10.0.0.2"))
        #expect(try store.devices().map(\.name) == ["laptop"])
        #expect(try store.device(withFingerprint: other.fingerprint)?.lastSeen == nil)
        try store.markSeen(other.fingerprint)
        #expect(try store.device(withFingerprint: other.fingerprint)?.lastSeen != nil)
        // Pairing again under the same name replaces the entry.
        let newer = try HostIdentity.ephemeral()
        try store.add(.init(name: "laptop", fingerprint: newer.fingerprint, pairedAt: Date()))
        #expect(try store.devices().map(\.fingerprint) == [newer.fingerprint])
        #expect(try store.remove("laptop").count == 1)
        #expect(try store.devices().isEmpty)
        var info = stat()
        #expect(stat(store.path, &info) == 0 && info.st_mode & 0o777 == 0o600)
        // Nothing but the list itself is left in the folder (the lock is the folder).
        #expect(try FileManager.default.contentsOfDirectory(atPath: machine.config.path).sorted()
            == ["host-cert.pem", "host-key.pem", "paired-devices.json"])
    }

    /// An entry added by hand (or by malware that can write the file but not read the key) is
    /// refused, not trusted; so is a damaged file or one others can read.
    @Test func tamperedDamagedOrLooseFilesAreErrors() throws {
        let machine = try Machine()
        defer { machine.cleanup() }
        let other = try HostIdentity.ephemeral()
        try machine.store.add(.init(name: "phone", fingerprint: other.fingerprint, pairedAt: Date()))
        let original = try String(contentsOfFile: machine.store.path, encoding: .utf8)

        let intruder = try HostIdentity.ephemeral()
        try original.replacingOccurrences(of: other.fingerprint.description, with: intruder.fingerprint.description)
            .write(toFile: machine.store.path, atomically: false, encoding: .utf8)
        #expect { try machine.store.devices() } throws: { ($0 as? QXferError)?.message.contains("changed outside qxfer") == true }

        try "{ not json".write(toFile: machine.store.path, atomically: false, encoding: .utf8)
        #expect { try machine.store.devices() } throws: { ($0 as? QXferError)?.message.contains("damaged") == true }

        try original.write(toFile: machine.store.path, atomically: false, encoding: .utf8)
        #expect(try machine.store.devices().count == 1)
        chmod(machine.store.path, 0o644)
        #expect { try machine.store.devices() } throws: { ($0 as? QXferError)?.message.contains("chmod 600") == true }

        // Another host's key does not validate this host's list.
        chmod(machine.store.path, 0o600)
        let stranger = PairedDevices(in: machine.config, identity: intruder)
        #expect(throws: QXferError.self) { try stranger.devices() }
    }
}

/// Pairing two machines over real loopback connections, on both stacks.
struct PairingLoopbackTests {
    enum StackKind: String, CaseIterable, Sendable { case quic, tls }

    struct Outcome {
        var initiator: Result<PairedDevices.Device, any Error>
        var responder: Result<PairedDevices.Device, any Error>
    }

    func pair(_ stack: StackKind, _ a: Machine, codeA: String, _ b: Machine, codeB: String) async throws -> Outcome {
        switch stack {
        case .quic: try await pair(QUIC(), a, codeA: codeA, b, codeB: codeB)
        case .tls: try await pair(TLS(), a, codeA: codeA, b, codeB: codeB)
        }
    }

    func pair<Transport: SecureTransport>(_ transport: Transport, _ a: Machine, codeA: String, _ b: Machine, codeB: String) async throws -> Outcome {
        let codeA = try #require(PairingCode(parsing: codeA)), codeB = try #require(PairingCode(parsing: codeB))
        let listener = NetworkListener(on: 0, host: "127.0.0.1") {
            Coder(PairingMessage.self, using: .json, maximumMessageSize: Pairing.maximumMessageSize) {
                transport.identity(b.identity).clientAuthentication(.optional)
            }
        }
        let (results, continuation) = AsyncStream.makeStream(of: Result<PairedDevices.Device, any Error>.self)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    do {
                        let hello = try await Pairing.firstMessage(of: connection)
                        continuation.yield(.success(try await Pairing.respond(
                            to: hello, over: connection, code: codeB, name: "bob", identity: b.identity, store: b.store)))
                    } catch {
                        continuation.yield(.failure(error))
                    }
                }
            }
            let port = try await listener.port
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                Coder(PairingMessage.self, using: .json, maximumMessageSize: Pairing.maximumMessageSize) {
                    transport.identity(a.identity).peerTrust(.anyCertificate)
                }
            }
            let initiator: Result<PairedDevices.Device, any Error>
            do {
                initiator = .success(try await Pairing.initiate(
                    over: connection, code: codeA, name: "alice", address: "127.0.0.1", identity: a.identity, store: a.store))
            } catch {
                initiator = .failure(error)
            }
            var responder: Result<PairedDevices.Device, any Error>?
            for await result in results {
                responder = result
                break
            }
            connection.cancel()
            group.cancelAll()
            return Outcome(initiator: initiator, responder: try #require(responder))
        }
    }

    @Test(arguments: StackKind.allCases)
    func theRightCodePairsBothSides(_ stack: StackKind) async throws {
        let a = try Machine(), b = try Machine()
        defer { a.cleanup(); b.cleanup() }
        let outcome = try await pair(stack, a, codeA: "482 913", b, codeB: "482913")
        let seenByA = try outcome.initiator.get(), seenByB = try outcome.responder.get()
        #expect(seenByA.name == "bob" && seenByA.fingerprint == b.identity.fingerprint && seenByA.address == "127.0.0.1")
        #expect(seenByB.name == "alice" && seenByB.fingerprint == a.identity.fingerprint)
        #expect(try a.store.devices() == [seenByA])
        #expect(try b.store.devices() == [seenByB])
    }

    @Test(arguments: StackKind.allCases)
    func aWrongCodePairsNeither(_ stack: StackKind) async throws {
        let a = try Machine(), b = try Machine()
        defer { a.cleanup(); b.cleanup() }
        let outcome = try await pair(stack, a, codeA: "482913", b, codeB: "482914")
        for result in [outcome.initiator, outcome.responder] {
            #expect { try result.get() } throws: { ($0 as? PairingError)?.kind == .wrongCode }
        }
        #expect(try a.store.devices().isEmpty)
        #expect(try b.store.devices().isEmpty)
    }

    /// Both ends of a connection compute the same exporter value, which the pairing binds; a
    /// different label gives a different value. On both stacks.
    @Test(arguments: StackKind.allCases)
    func exporterValues(_ stack: StackKind) async throws {
        let server = try HostIdentity.ephemeral(), client = try HostIdentity.ephemeral()
        switch stack {
        case .quic: try await checkExporter(QUIC(), server: server, client: client)
        case .tls: try await checkExporter(TLS(), server: server, client: client)
        }
    }

    func checkExporter<Transport: SecureTransport>(_ transport: Transport, server: HostIdentity, client: HostIdentity) async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { TLV { transport.identity(server) } }
        let (values, continuation) = AsyncStream.makeStream(of: [UInt8]?.self)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    continuation.yield(try? await connection.exportKeyingMaterial(label: "EXPORTER-test", length: 32))
                    _ = try? await connection.receive()
                }
            }
            let port = try await listener.port
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                TLV { transport.identity(client).peerFingerprint(server.fingerprint) }
            }
            try await connection.send([1], type: 1)
            let clientValue = try? await connection.exportKeyingMaterial(label: "EXPORTER-test", length: 32)
            let otherLabel = try? await connection.exportKeyingMaterial(label: "EXPORTER-other", length: 32)
            var serverValue: [UInt8]??
            for await value in values {
                serverValue = value
                break
            }
            #expect(clientValue?.count == 32)
            #expect(serverValue == .some(clientValue))
            #expect(otherLabel != nil && otherLabel != clientValue)
            connection.cancel()
            group.cancelAll()
        }
    }
}
