import Foundation
import Testing
import NIOCore
import QXfer
import QUICEngine
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC

/// Session tickets kept in the configuration folder and offered on the next QUIC connection.
@Suite("QUIC session resumption")
struct QUICResumptionTests {
    static let echo: @Sendable (NetworkConnection<QUIC>) async throws -> Void = { try await echoUntilFinished($0) }

    static func listener(allowing clients: [Fingerprint]) -> NetworkListener<QUIC> {
        NetworkListener(on: 0, host: "127.0.0.1") {
            QUIC().identity(Identities.server).clientAuthentication(.required(allowing: clients))
        }
    }

    /// One ping through a connection that keeps tickets in `store`.
    static func ping(port: UInt16, store: SessionTicketStore, identity: HostIdentity = Identities.client) async throws {
        let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
            QUIC().identity(identity).peerFingerprint(Identities.server.fingerprint).sessionTickets(store)
        }
        defer { connection.cancel() }
        try await connection.send(Data("ping".utf8))
        #expect(try await connection.receive(exactly: 4).content == Data("ping".utf8))
    }

    @Test("A ticket is stored (0600) and replaced by each connection, and a resumed client off the allow list is refused")
    func ticketStoredAndAllowListStillApplies() async throws {
        let directory = TemporaryDirectory()
        let store = SessionTicketStore(in: ConfigDirectory(path: directory.path))
        let first = try await withListener(Self.listener(allowing: [Identities.client.fingerprint]), handler: Self.echo) { port in
            try await Self.ping(port: port, store: store)
            let endpoint = Endpoint.hostPort(host: "127.0.0.1", port: port)
            #expect(await eventually { store.ticket(for: endpoint) != nil }, "no ticket stored")
            let ticket = try #require(store.ticket(for: endpoint))
            try await Self.ping(port: port, store: store)
            #expect(await eventually { store.ticket(for: endpoint).map { $0 != ticket } ?? false }, "the second connection brought no new ticket")
            return port
        }
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: store.path)[.posixPermissions] as? Int)
        #expect(mode & 0o777 == 0o600)

        // The same receiver identity (so the ticket opens) with a list that no longer names the client.
        try await withListener(Self.listener(allowing: [Identities.stranger.fingerprint]), handler: Self.echo) { port in
            // Carry the ticket over to the new port, with the receiver's fingerprint: the ping goes early.
            store.save(store.ticket(for: .hostPort(host: "127.0.0.1", port: first)), for: .hostPort(host: "127.0.0.1", port: port),
                       fingerprint: Identities.server.fingerprint)
            #expect(store.ticket(for: .hostPort(host: "127.0.0.1", port: port)) != nil)
            let error = await #expect(throws: QXferError.self) { try await Self.ping(port: port, store: store) }
            #expect(error?.code == .untrustedPeer)
        }
    }

    @Test("A trusted receiver's ticket carries its fingerprint; the next connection's first bytes are early data, taken once and recorded")
    func earlyDataToAKnownReceiver() async throws {
        let client = TemporaryDirectory()
        let server = TemporaryDirectory()
        let store = SessionTicketStore(in: ConfigDirectory(path: client.path))
        let register = EarlyDataRegister(in: ConfigDirectory(path: server.path))
        let listener = NetworkListener(on: 0, host: "127.0.0.1") {
            QUIC().identity(Identities.server).clientAuthentication(.required(allowing: [Identities.client.fingerprint]))
                .earlyDataRegister(register)
        }
        try await withListener(listener, handler: Self.echo) { port in
            let endpoint = Endpoint.hostPort(host: "127.0.0.1", port: port)
            try await Self.ping(port: port, store: store)
            #expect(await eventually { store.entry(for: endpoint)?.fingerprint == Identities.server.fingerprint },
                    "the ticket was not kept with the receiver's fingerprint")
            #expect(((try? FileManager.default.contentsOfDirectory(atPath: register.path)) ?? []).isEmpty)
            try await Self.ping(port: port, store: store)
            // The listener took the ping as early data: one ClientHello recorded.
            let entries = try FileManager.default.contentsOfDirectory(atPath: register.path)
            #expect(entries.count == 1)
            // Kept (and GnuTLS's filter period as long) as the sender keeps its ticket: a ticket
            // used for early data is not refused for it before it expires, but for one new period.
            var info = stat()
            #expect(lstat(register.path + "/" + (entries.first ?? ""), &info) == 0)
            #expect(Int64(info.st_mtim.tv_sec) >= Int64(time(nil)) + store.lifetime.components.seconds - 60,
                    "the register forgets a ClientHello before its ticket expires")
        }
        // A stack in a race sends nothing early: it has not heard the peer yet.
        let raced = try #require(QUIC().transport.stack.racing() as? QUICTransportStack)
        #expect(raced.quic.sendsEarlyData == false && QUIC().sendsEarlyData)
    }

    @Test("A resumed client to a listener whose window budget is spent connects with a full handshake, its early data sent again")
    func earlyDataBeyondTheWindowBudget() async throws {
        let directory = TemporaryDirectory()
        let store = SessionTicketStore(in: ConfigDirectory(path: directory.path))
        // Room for one connection's 1 MiB window and a little: the first connection's ticket
        // remembers 1 MiB; while another connection holds the budget, a new one gets 256 KiB.
        // Taking early data with it would have the client fail the handshake (ngtcp2: the
        // limits remembered for early data were lowered, RFC 9000 §7.4.1).
        var quic = QUIC().identity(Identities.server).clientAuthentication(.required(allowing: [Identities.client.fingerprint]))
        quic.receiveWindowBudget = (1 << 20) + (256 << 10)
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { quic }
        try await withListener(listener, handler: Self.echo) { port in
            let endpoint = Endpoint.hostPort(host: "127.0.0.1", port: port)
            try await Self.ping(port: port, store: store)
            #expect(await eventually { store.entry(for: endpoint)?.fingerprint == Identities.server.fingerprint }, "no ticket stored")
            let holder = NetworkConnection(to: endpoint) {
                QUIC().identity(Identities.client).peerFingerprint(Identities.server.fingerprint)
            }
            defer { holder.cancel() }
            try await holder.send(Data("hold".utf8))
            #expect(try await holder.receive(exactly: 4).content == Data("hold".utf8))
            try await Self.ping(port: port, store: store)
        }
    }

    @Test("The early-data register takes a ClientHello once, across processes' registers, and forgets old entries")
    func earlyDataRegisterTakesOnce() async throws {
        let directory = TemporaryDirectory()
        let register = EarlyDataRegister(in: ConfigDirectory(path: directory.path))
        let other = EarlyDataRegister(in: ConfigDirectory(path: directory.path))  // another receiver process
        let binder = (0..<32).map { UInt8($0) }
        let expiry = Int64(time(nil)) + 600
        #expect(register.record(binder, until: expiry))
        #expect(!register.record(binder, until: expiry))
        #expect(!other.record(binder, until: expiry))
        #expect(!register.record([], until: 0))
        #expect(!register.record(Array(repeating: 1, count: EarlyDataRegister.maximumKeyLength + 1), until: 0))
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: register.path)[.posixPermissions] as? Int)
        #expect(mode & 0o777 == 0o700)
        // An entry is kept until its moment passed, then goes at the next pruning (on a thread
        // of its own).
        let later = TemporaryDirectory()
        let fresh = EarlyDataRegister(in: ConfigDirectory(path: later.path))
        #expect(fresh.record([7], until: Int64(time(nil)) - 10))
        #expect(fresh.record([6], until: expiry))
        EarlyDataRegister.forgetPruneTimes()
        #expect(fresh.record([8], until: expiry))
        #expect(await eventually { !FileManager.default.fileExists(atPath: fresh.path + "/07") }, "an expired entry stayed")
        #expect(FileManager.default.fileExists(atPath: fresh.path + "/06"), "an entry went before its moment")
        #expect(FileManager.default.fileExists(atPath: fresh.path + "/08"), "an entry went before its moment")
        #expect(fresh.record([7], until: expiry), "an expired entry still refused its ClientHello")
    }

    @Test("A damaged ticket costs a full handshake, never the connection, and is replaced")
    func damagedTicketFallsBack() async throws {
        let directory = TemporaryDirectory()
        let store = SessionTicketStore(in: ConfigDirectory(path: directory.path))
        try await withListener(Self.listener(allowing: [Identities.client.fingerprint]), handler: Self.echo) { port in
            let endpoint = Endpoint.hostPort(host: "127.0.0.1", port: port)
            let damaged = QUICSessionTicket(tlsSession: Array(repeating: 0x5A, count: 300), transportParameters: [1, 2, 3])
            store.save(damaged, for: endpoint)
            #expect(store.ticket(for: endpoint) == damaged)
            try await Self.ping(port: port, store: store)
            #expect(await eventually { store.ticket(for: endpoint).map { $0 != damaged } ?? false })
        }
    }

    @Test("A ticket keeps the address it came over, and the next connection tries that address first")
    func ticketsRememberTheirAddress() throws {
        let directory = TemporaryDirectory()
        let store = SessionTicketStore(in: ConfigDirectory(path: directory.path))
        let ticket = QUICSessionTicket(tlsSession: [1, 2, 3], transportParameters: [4])
        let fingerprint = Identities.server.fingerprint
        for (host, fingerprint, address) in [("a", fingerprint, "::1"), ("b", nil, "192.0.2.7"), ("c", fingerprint, nil), ("d", nil, nil)] {
            store.save(ticket, for: .hostPort(host: host, port: 7447), fingerprint: fingerprint, address: address)
        }
        // Each entry written is read back as it was, older four- and five-field lines included.
        let read = Dictionary(uniqueKeysWithValues: store.load().map { ($0.host, $0) })
        #expect(read["a:7447"]?.fingerprint == fingerprint && read["a:7447"]?.address == "::1")
        #expect(read["b:7447"]?.fingerprint == nil && read["b:7447"]?.address == "192.0.2.7")
        #expect(read["c:7447"]?.fingerprint == fingerprint && read["c:7447"]?.address == nil)
        #expect(read["d:7447"]?.fingerprint == nil && read["d:7447"]?.address == nil)
        // An address that is not printable is not kept (the file would be refused whole).
        store.save(ticket, for: .hostPort(host: "e", port: 7447), address: "bad address")
        #expect(store.entry(for: .hostPort(host: "e", port: 7447))?.address == nil)
        #expect(store.load().count == 5)

        let v6 = try SocketAddress(ipAddress: "::1", port: 7447), v4 = try SocketAddress(ipAddress: "127.0.0.1", port: 7447)
        let other = try SocketAddress(ipAddress: "192.0.2.7", port: 7447)
        #expect(QUICConnector.leading([v6, v4, other], with: "127.0.0.1") == [v4, v6, other])
        #expect(QUICConnector.leading([v6, v4, other], with: "192.0.2.7") == [other, v6, v4])
        #expect(QUICConnector.leading([v6, v4], with: "::1") == [v6, v4])
        #expect(QUICConnector.leading([v6, v4], with: "198.51.100.1") == [v6, v4], "a name that no longer resolves to it keeps its order")
        #expect(QUICConnector.leading([v6, v4], with: nil) == [v6, v4])
    }

    @Test("Hostile ticket files are ignored whole")
    func hostileFiles() throws {
        let directory = TemporaryDirectory()
        let store = SessionTicketStore(in: ConfigDirectory(path: directory.path))
        let endpoint = Endpoint.hostPort(host: "example", port: 7447)
        let ticket = QUICSessionTicket(tlsSession: [1, 2, 3], transportParameters: [4])
        store.save(ticket, for: endpoint)
        #expect(store.ticket(for: endpoint) == ticket)
        let good = try String(contentsOfFile: store.path, encoding: .utf8)
        let line = String(good.dropLast()), fingerprint = Identities.server.fingerprint.description
        let huge = String(repeating: "A", count: 2 * QUICSessionTicket.maximumPartLength)
        let texts: [String] = [
            good + "garbage\n",                                     // one bad line spoils the file
            good + "other:1 99999999999 !!! AAAA\n",                // not base64
            "example:7447 99999999999 \(huge) AAAA\n",              // a part over the bound
            "example:7447 -5 AQID BA==\n",                          // a negative expiry
            "example:7447 99999999999  BA==\n",                     // an empty session
            line + " 12ab\n",                                       // a fingerprint that is none
            line + " via=\n",                                       // an empty address
            line + " via=::1 via=::2\n",                            // two addresses
            line + " via=::1 " + fingerprint + "\n",                // the fingerprint after the address
            line + " " + fingerprint + " via=::1 x\n",              // seven fields
            String(repeating: good, count: 400),                    // larger than any file qxfer writes
        ]
        for text in texts {
            try text.write(toFile: store.path, atomically: false, encoding: .utf8)
            #expect(store.ticket(for: endpoint) == nil, "accepted: \(text.prefix(60))")
        }
        // Not a regular file.
        try FileManager.default.removeItem(atPath: store.path)
        #expect(mkfifo(store.path, 0o600) == 0)
        #expect(store.ticket(for: endpoint) == nil)
        try FileManager.default.removeItem(atPath: store.path)
        // Expired entries are not offered, and saving nil forgets the host.
        store.save(ticket, for: endpoint, now: Date(timeIntervalSinceNow: -7 * 3600))
        #expect(store.ticket(for: endpoint) == nil)
        store.save(ticket, for: endpoint)
        store.save(nil, for: endpoint)
        #expect(store.ticket(for: endpoint) == nil)
        // The file keeps at most `capacity` hosts.
        for port in 1...(SessionTicketStore.capacity + 10) {
            store.save(ticket, for: .hostPort(host: "h", port: UInt16(port)))
        }
        #expect(store.load().count == SessionTicketStore.capacity)
    }
}
