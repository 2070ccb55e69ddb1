import Foundation
import Testing
import QXfer
import QUICEngine
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferRace
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// The files under the configuration folder are replaced atomically where they are regular
/// files, followed where they are symlinks, and refused — never replaced, never waited on —
/// where something else stands at their name.
@Suite struct ConfigFileTests {
    func type(_ path: String) -> mode_t {
        var info = stat()
        return lstat(path, &info) == 0 ? info.st_mode & S_IFMT : 0
    }

    @Test func aPipeAtKnownHostsIsRefusedAtOnceAndLeftAlone() throws {
        let directory = TemporaryDirectory()
        let file = KnownHosts(path: directory.file("known_hosts"))
        #expect(mkfifo(file.path, 0o600) == 0)
        // Both would block forever on a pipe with no other end.
        let reading = #expect(throws: QXferError.self) { try file.entries() }
        #expect(reading?.message.contains("not a regular file") == true)
        #expect(throws: QXferError.self) { try file.add("host:1", Identities.server.fingerprint) }
        #expect(type(file.path) == S_IFIFO)
    }

    @Test func pairedDevicesFollowASymlinkAndRefuseOtherFiles() throws {
        let directory = TemporaryDirectory()
        let config = ConfigDirectory(path: directory.file("cfg"))
        let identity = try HostIdentity.loadOrCreate(in: config)
        let devices = PairedDevices(in: config, identity: identity)
        let list = config.file("paired-devices.json")
        try devices.add(PairedDevices.Device(name: "one", fingerprint: Identities.client.fingerprint, pairedAt: Date()))
        #expect(type(list) == S_IFREG)

        // Kept in another folder (a dotfiles repository) behind a symlink: the link stays.
        let kept = directory.file("paired-devices.json")
        #expect(rename(list, kept) == 0 && symlink(kept, list) == 0)
        try devices.add(PairedDevices.Device(name: "two", fingerprint: Identities.stranger.fingerprint, pairedAt: Date()))
        #expect(type(list) == S_IFLNK && type(kept) == S_IFREG)
        #expect(try devices.devices().map(\.name) == ["one", "two"])

        // A pipe at the list's name: refused, not replaced.
        unlink(list)
        #expect(mkfifo(list, 0o600) == 0)
        #expect(throws: QXferError.self) {
            try devices.add(PairedDevices.Device(name: "three", fingerprint: Identities.server.fingerprint, pairedAt: Date()))
        }
        #expect(type(list) == S_IFIFO)
    }

    /// Processes that start at once on a new folder (`qxfer recv &` and `qxfer send` from one
    /// script) must agree on one identity. Before the folder's lock, two creators could leave
    /// one's key beside the other's certificate ("does not belong"), for good, and one that
    /// looked between another's two writes failed with "identity is incomplete".
    @Test func identitiesCreatedAtOnceAgree() throws {
        let directory = TemporaryDirectory()
        for round in 0..<12 {
            let config = ConfigDirectory(path: directory.file("cfg\(round)"))
            let results = Locked<[String]>([])  // not Synchronization.Mutex, which ThreadSanitizer cannot see (SECURITY.md §5)
            DispatchQueue.concurrentPerform(iterations: 4) { _ in
                let result: String
                do { result = "\(try HostIdentity.loadOrCreate(in: config).fingerprint)" } catch { result = "error: \(error)" }
                results.withLock { $0.append(result) }
            }
            let fingerprints = results.withLock { $0 }
            #expect(Set(fingerprints).count == 1, "round \(round): \(Set(fingerprints))")
            #expect(try "\(HostIdentity.loadOrCreate(in: config).fingerprint)" == fingerprints.first, "round \(round)")
        }
    }
    /// Sends to several hosts at once from one script each save their host's session ticket and
    /// race winner: every entry must stay. Before the folder's lock each process wrote back the
    /// file as it had read it plus its own entry, and one host's could vanish.
    @Test func memoriesSavedAtOnceKeepEveryHost() throws {
        let directory = TemporaryDirectory()
        let config = ConfigDirectory(path: directory.file("cfg"))
        let tickets = SessionTicketStore(in: config)
        let stacks = StackMemory(path: config.file("stacks"))
        let hosts = (0..<6).map { Endpoint.hostPort(host: "10.0.0.\($0)", port: 7447) }
        for round in 0..<8 {
            DispatchQueue.concurrentPerform(iterations: hosts.count) { index in
                let ticket = QUICSessionTicket(tlsSession: [UInt8(round), UInt8(index)], transportParameters: [1])
                tickets.save(ticket, for: hosts[index])
                stacks.record(winner: "TCP+TLS", preferred: "QUIC", for: hosts[index])
            }
            for (index, host) in hosts.enumerated() {
                #expect(tickets.ticket(for: host)?.tlsSession == [UInt8(round), UInt8(index)], "round \(round): \(host)'s ticket")
                #expect(stacks.entry(for: host)?.stack == "TCP+TLS", "round \(round): \(host)'s race winner")
            }
        }
    }
}
