import Foundation
import LinuxSystem
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// A veth pair between a namespace the test creates and either the test's own (root) namespace
/// or a second created namespace; removed by ``remove()``. Multicast works on it from the
/// start: links up, IPv6 without duplicate address detection, a route for 224.0.0.0/4.
struct VethLink: Sendable {
    /// nil: the test process's own namespace.
    let leftNamespace: String?
    let leftInterface: String
    let leftAddress: String
    let rightNamespace: String
    let rightInterface: String
    let rightAddress: String

    private static let counter = Locked(0)

    static func create(twoNamespaces: Bool = false) async throws -> VethLink {
        let serial = counter.withLock { value -> Int in
            value += 1
            return value
        }
        let id = Int(getpid()) % 1000 * 10 + serial % 10
        let subnet = "10.234.\(serial % 250)"
        let link = VethLink(
            leftNamespace: twoNamespaces ? "qxmdl\(id)" : nil, leftInterface: "qxl\(id)", leftAddress: "\(subnet).1",
            rightNamespace: "qxmdr\(id)", rightInterface: "qxr\(id)", rightAddress: "\(subnet).2")
        do {
            if let left = link.leftNamespace { try await ip(["netns", "add", left]) }
            try await ip(["netns", "add", link.rightNamespace])
            try await ip(["link", "add", link.leftInterface, "type", "veth", "peer", "name", link.rightInterface])
            try await ip(["link", "set", link.rightInterface, "netns", link.rightNamespace])
            if let left = link.leftNamespace { try await ip(["link", "set", link.leftInterface, "netns", left]) }
            for (namespace, interface, address) in [
                (link.leftNamespace, link.leftInterface, link.leftAddress), (link.rightNamespace, link.rightInterface, link.rightAddress),
            ] {
                let prefix = namespace.map { ["-n", $0] } ?? []
                _ = try await link.run(in: namespace, "/usr/sbin/sysctl", ["-qw", "net.ipv6.conf.\(interface).accept_dad=0"])
                try await ip(prefix + ["addr", "add", "\(address)/24", "dev", interface])
                try await ip(prefix + ["link", "set", interface, "up"])
                if namespace != nil {
                    try await ip(prefix + ["link", "set", "lo", "up"])
                    try await ip(prefix + ["route", "add", "224.0.0.0/4", "dev", interface])
                }
            }
        } catch {
            await link.remove()
            throw error
        }
        return link
    }

    /// Removes the link and the namespaces, ending anything still running in them.
    func remove() async {
        for namespace in [leftNamespace, rightNamespace].compactMap({ $0 }) {
            if let pids = try? await Self.ipOutput(["netns", "pids", namespace]) {
                for pid in pids.split(whereSeparator: \.isNewline).compactMap({ Int32($0) }) { kill(pid, SIGKILL) }
            }
        }
        if leftNamespace == nil { _ = try? await Self.ip(["link", "del", leftInterface]) }
        for namespace in [leftNamespace, rightNamespace].compactMap({ $0 }) {
            _ = try? await Self.ip(["netns", "del", namespace])
        }
    }

    /// Runs a program inside `namespace` (or here, for nil).
    func run(in namespace: String?, _ executable: String, _ arguments: [String], timeout: Duration = .seconds(30)) async throws -> Subprocess {
        guard let namespace else { return try await Subprocess.run(executable, arguments, timeout: timeout) }
        return try await Subprocess.run(Self.ipPath, ["netns", "exec", namespace, executable] + arguments, timeout: timeout)
    }

    static var ipPath: String { Subprocess.which("ip") ?? "/usr/sbin/ip" }

    @discardableResult
    static func ip(_ arguments: [String]) async throws -> Subprocess {
        let result = try await Subprocess.run(ipPath, arguments)
        guard result.status == 0 else {
            throw HangError(what: "ip \(arguments.joined(separator: " ")) failed (\(result.status)): \(result.stderr)")
        }
        return result
    }

    static func ipOutput(_ arguments: [String]) async throws -> String { try await ip(arguments).stdout }
}

/// python3-zeroconf, Debian's independent mDNS implementation, as the peer.
enum Zeroconf {
    static let python = "/usr/bin/python3"

    static let browseScript = """
        import json, socket, sys, time
        from zeroconf import Zeroconf, ServiceBrowser, ServiceInfo, IPVersion
        ip, want, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
        kind = "_qxfer._udp.local."
        zc = Zeroconf(interfaces=[ip], ip_version=IPVersion.V4Only)
        names = set()
        class Listener:
            def add_service(self, zc, t, name): names.add(name)
            def update_service(self, zc, t, name): names.add(name)
            def remove_service(self, zc, t, name): names.discard(name)
        browser = ServiceBrowser(zc, kind, Listener())
        found = {}
        deadline = time.time() + timeout
        while time.time() < deadline and len(found) < want:
            for name in list(names):
                if name in found: continue
                info = ServiceInfo(kind, name)
                if info.request(zc, 2000):
                    found[name] = {"name": name[:-len("." + kind)], "port": info.port, "server": info.server,
                        "addresses": [socket.inet_ntoa(a) for a in info.addresses],
                        "txt": {k.decode(): (v.decode() if v is not None else None) for k, v in info.properties.items()}}
            time.sleep(0.1)
        print(json.dumps(sorted(found.values(), key=lambda s: s["name"])), flush=True)
        browser.cancel()
        zc.close()
        """

    static let publishScript = """
        import socket, sys, time
        from zeroconf import Zeroconf, ServiceInfo, IPVersion
        ip, name, port, fp, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
        zc = Zeroconf(interfaces=[ip], ip_version=IPVersion.V4Only)
        info = ServiceInfo("_qxfer._udp.local.", name + "._qxfer._udp.local.", addresses=[socket.inet_aton(ip)],
                           port=port, properties={"fp": fp, "txtvers": "1"}, server="zcpeer.local.")
        zc.register_service(info)
        print("registered", flush=True)
        time.sleep(hold)
        zc.unregister_service(info)
        print("unregistered", flush=True)
        zc.close()
        """

    /// Hostile packets to the group, then a legacy unicast query that must still be answered.
    static let hostileScript = """
        import socket, struct, sys
        ip, label, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ip))
        s.bind((ip, 0))
        def header(qd=0, an=0): return struct.pack("!6H", 0, 0x8400, qd, an, 0, 0)
        def name(text): return b"".join(bytes([len(l)]) + l.encode() for l in text.split(".")) + b"\\x00"
        hostile = [
            header()[:7],                                              # truncated header
            header(qd=1) + b"\\xc0\\x0c\\x00\\x0c\\x00\\x01",          # pointer to itself
            header(qd=1) + b"\\x01a\\xc0\\x0c\\x00\\x01\\x00\\x01",    # label, then a pointer back to it
            header(an=0xffff) + b"\\x00" * 11,                         # 65535 answers in 11 bytes
            header(an=1) + name("x.local") + struct.pack("!HHIH", 1, 1, 120, 200) + b"\\x01\\x02",  # rdata past the end
        ]
        for packet in hostile * 4:
            s.sendto(packet, ("224.0.0.251", 5353))
        query = struct.pack("!6H", 0x4242, 0, 1, 0, 0, 0) + name("_qxfer._udp.local") + struct.pack("!2H", 12, 1)
        s.settimeout(3)
        s.sendto(query, ("224.0.0.251", 5353))
        data, source = s.recvfrom(9000)
        ok = data[:2] == b"\\x42\\x42" and label.encode() in data and struct.pack("!H", port) in data
        print("answered" if ok else "bad reply", flush=True)
        """

    static func script(_ text: String, in directory: TemporaryDirectory, named name: String) throws -> String {
        let path = directory.file(name)
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    struct Found: Decodable, Equatable {
        var name: String
        var port: Int
        var server: String?
        var addresses: [String]
        var txt: [String: String?]
    }

    /// Browses from the link's right namespace (or, with `fromLeft`, from the left side, beside
    /// qxfer on the same port) until `count` services are resolved or `timeout` passes.
    static func browse(on link: VethLink, count: Int, timeout: Double = 10, fromLeft: Bool = false) async throws -> [Found] {
        let scratch = TemporaryDirectory()
        let script = try script(browseScript, in: scratch, named: "browse.py")
        let run = fromLeft
            ? try await link.run(in: link.leftNamespace, python, [script, link.leftAddress, "\(count)", "\(timeout)"])
            : try await link.run(in: link.rightNamespace, python, [script, link.rightAddress, "\(count)", "\(timeout)"])
        guard run.status == 0 else { throw HangError(what: "zeroconf browse: \(run.stderr)") }
        return try JSONDecoder().decode([Found].self, from: Data(run.stdout.utf8))
    }
}

/// Runs `advertiser` in a child task while `body` runs; cancelling it sends the goodbye.
func withAdvertiser<T: Sendable>(
    _ advertiser: NetworkAdvertiser, registered: @escaping @Sendable (String) async -> Void,
    _ body: () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await advertiser.run(registered: registered) }
        defer { group.cancelAll() }
        return try await body()
    }
}

@Suite("Discovery: multicast DNS between network namespaces", .serialized)
struct DiscoveryNetworkTests {
    static let fingerprint = Identities.server.fingerprint.description

    static func prerequisites() throws {
        try #require(getuid() == 0, "these tests create network namespaces and need root")
        try #require(FileManager.default.isExecutableFile(atPath: Zeroconf.python), "/usr/bin/python3 is missing")
        let check = try Subprocess.runBlocking(Zeroconf.python, ["-c", "import zeroconf"], timeout: .seconds(20))
        try #require(check.status == 0, "python3-zeroconf is missing (scripts/install-deps.sh installs it)")
    }

    /// Waits until `names` holds `count` distinct latest names.
    static func waitForNames(_ names: Recorder<String>, count: Int, timeout: Duration = .seconds(10)) async -> Bool {
        await eventually(timeout: timeout) { Set(names.all).count >= count }
    }

    @Test("python-zeroconf sees qxfer's advertisement with its port, TXT and address")
    func zeroconfSeesAdvertisement() async throws {
        try Self.prerequisites()
        let link = try await VethLink.create()
        defer { Task { await link.remove() } }
        let service = DNSSDService(name: "qx adv.test", type: "_qxfer._udp", port: 4433, txt: ["fp": Self.fingerprint, "txtvers": "1"])
        let names = Recorder<String>()
        let found = try await withAdvertiser(NetworkAdvertiser(service, interfaces: [link.leftInterface]), registered: { names.append($0) }) {
            #expect(await Self.waitForNames(names, count: 1))
            return try await Zeroconf.browse(on: link, count: 1)
        }
        await link.remove()
        #expect(names.all == ["qx adv.test"])
        let peer = try #require(found.first, "python-zeroconf found nothing")
        #expect(found.count == 1)
        #expect(peer.name == "qx adv.test")  // a dot inside the instance label survives
        #expect(peer.port == 4433)
        #expect(peer.txt["fp"] == .some(Self.fingerprint))
        #expect(peer.txt["txtvers"] == .some("1"))
        #expect(peer.addresses.contains(link.leftAddress))
    }

    @Test("python-zeroconf on the same host shares port 5353 with the advertiser and still hears it")
    func sharesThePortWithAnotherResponder() async throws {
        try Self.prerequisites()
        let link = try await VethLink.create()
        defer { Task { await link.remove() } }
        let service = DNSSDService(name: "qx neighbour", type: "_qxfer._udp", port: 4434, txt: ["fp": Self.fingerprint])
        let names = Recorder<String>()
        let found = try await withAdvertiser(NetworkAdvertiser(service, interfaces: [link.leftInterface]), registered: { names.append($0) }) {
            #expect(await Self.waitForNames(names, count: 1))
            // zeroconf binds 0.0.0.0:5353 too (SO_REUSEADDR/SO_REUSEPORT), in this very namespace.
            return try await Zeroconf.browse(on: link, count: 1, fromLeft: true)
        }
        await link.remove()
        #expect(found.map(\.name) == ["qx neighbour"])
        #expect(found.first?.port == 4434)
    }

    @Test("NetworkBrowser sees a service python-zeroconf publishes, and its goodbye removes it")
    func browserSeesZeroconfThenGoodbye() async throws {
        try Self.prerequisites()
        let link = try await VethLink.create()
        defer { Task { await link.remove() } }
        let scratch = TemporaryDirectory()
        let script = try Zeroconf.script(Zeroconf.publishScript, in: scratch, named: "publish.py")
        let browser = NetworkBrowser(for: .dnssd(type: "_qxfer._udp"), interfaces: [link.leftInterface])
        let timeline = Recorder<(ContinuousClock.Instant, [Endpoint])>()

        try await withThrowingTaskGroup(of: Subprocess?.self) { group in
            group.addTask {
                try await link.run(in: link.rightNamespace, Zeroconf.python, [script, link.rightAddress, "zc peer", "7001", Self.fingerprint, "4"])
            }
            group.addTask {
                _ = try await within(.seconds(20), "browsing until the service comes and goes") {
                    var seen: Endpoint?
                    return try await browser.run { endpoints in
                        timeline.append((ContinuousClock.now, endpoints))
                        if let first = endpoints.first { seen = first }
                        if endpoints.isEmpty, let seen { return .finish(seen) }
                        return .continue
                    }
                }
                return nil
            }
            for try await publisher in group {
                if let publisher { #expect(publisher.stdout.contains("unregistered"), "\(publisher.stderr)") }
            }
        }
        await link.remove()
        let states = timeline.all
        let appeared = try #require(states.first { !$0.1.isEmpty })
        let endpoint = try #require(appeared.1.first)
        #expect(appeared.1.count == 1)
        #expect(endpoint.host == link.rightAddress && endpoint.port == 7001)
        #expect(endpoint.service?.name == "zc peer")
        #expect(endpoint.service?.hostName == "zcpeer.local")
        #expect(endpoint.service?.txt["fp"] == Self.fingerprint)
        let vanished = try #require(states.last)
        #expect(vanished.1.isEmpty)
        // The records' TTLs run for minutes: only the goodbye explains a quick removal.
        #expect(vanished.0 - appeared.0 < .seconds(10))
    }

    @Test("two advertisers with the same name end with distinct names, both visible to python-zeroconf")
    func sameNameConflict() async throws {
        try Self.prerequisites()
        let link = try await VethLink.create()
        defer { Task { await link.remove() } }
        let first = Recorder<String>()
        let second = Recorder<String>()
        func service(_ port: UInt16) -> NetworkAdvertiser {
            NetworkAdvertiser(DNSSDService(name: "qx dup", type: "_qxfer._udp", port: port, txt: ["fp": Self.fingerprint]),
                              interfaces: [link.leftInterface])
        }
        let found = try await withAdvertiser(service(5001), registered: { first.append($0) }) {
            try await withAdvertiser(service(5002), registered: { second.append($0) }) {
                #expect(await eventually(timeout: .seconds(10)) {
                    guard let a = first.all.last, let b = second.all.last else { return false }
                    return Set([a, b]) == ["qx dup", "qx dup (2)"]
                })
                return try await Zeroconf.browse(on: link, count: 2)
            }
        }
        await link.remove()
        #expect(Set(found.map(\.name)) == ["qx dup", "qx dup (2)"])
        #expect(Set(found.map(\.port)) == [5001, 5002])
        // Each name points at the port of the advertiser that holds it.
        let holder = first.all.last == "qx dup" ? 5001 : 5002
        #expect(found.first { $0.name == "qx dup" }?.port == holder)
    }

    @Test("hostile packets (truncated, compression loops, huge counts) are dropped and the responder keeps answering")
    func hostilePacketsDropped() async throws {
        try Self.prerequisites()
        let link = try await VethLink.create()
        defer { Task { await link.remove() } }
        let scratch = TemporaryDirectory()
        let script = try Zeroconf.script(Zeroconf.hostileScript, in: scratch, named: "hostile.py")
        let interfaces = MDNSSockets.interfaces(named: [link.leftInterface])
        try #require(interfaces.count == 1)
        let service = DNSSDService(name: "qx sturdy", type: "_qxfer._udp", port: 4567, txt: ["fp": Self.fingerprint])
        let (events, continuation) = AsyncStream.makeStream(of: MDNSResponder.Event.self)
        let session = try await MDNSSession.open(MDNSResponder(service: service, hostLabel: "qxsturdy", interfaces: interfaces), interfaces: interfaces) { machine in
            for event in machine.takeEvents() { continuation.yield(event) }
        }
        let registered = try await within(.seconds(5), "registration") {
            for await event in events { if case .registered(let name) = event { return name } }
            return ""
        }
        #expect(registered == "qx sturdy")
        let run = try await link.run(in: link.rightNamespace, Zeroconf.python, [script, link.rightAddress, "qx sturdy", "4567"])
        #expect(run.stdout.contains("answered"), "\(run.stdout) \(run.stderr)")
        let dropped = await session.droppedPackets
        #expect(dropped == 20)  // five hostile packets, four times each
        // And an independent implementation still resolves it.
        let found = try await Zeroconf.browse(on: link, count: 1)
        #expect(found.first?.port == 4567)
        await session.shutdown()
        continuation.finish()
        await link.remove()
    }

    @Test("a listener advertising itself is found by NetworkBrowser and reached with NetworkConnection (pinned from TXT)")
    func listenerFoundAndConnected() async throws {
        try Self.prerequisites()
        let link = try await VethLink.create()
        defer { Task { await link.remove() } }
        let listener = NetworkListener(on: 0) { TLS().identity(Identities.server) }
        let service = DNSSDService(name: "qx listener", type: "_qxfer._udp", port: 0, txt: ["fp": Self.fingerprint])
        let reply = try await within(.seconds(20), "advertise, browse, connect") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    try await listener.run(advertising: service, interfaces: [link.leftInterface], echoUntilFinished)
                }
                defer { group.cancelAll() }
                let endpoint = try await NetworkBrowser(for: .dnssd(type: "_qxfer._udp"), interfaces: [link.leftInterface])
                    .resolve(named: "QX LISTENER", timeout: .seconds(10))
                #expect(endpoint.port == (try await listener.port))
                #expect(endpoint.host == link.leftAddress)
                let pin = try #require(endpoint.service?.txt["fp"].flatMap { Fingerprint(parsing: $0) })
                let connection = NetworkConnection(to: endpoint) { TLS().identity(Identities.client).peerFingerprint(pin) }
                try await connection.send(Data("hello".utf8))
                let echoed = try await connection.receive(exactly: 5).content
                connection.cancel()
                return String(decoding: echoed, as: UTF8.self)
            }
        }
        await link.remove()
        #expect(reply == "hello")
    }

    @Test("resolving with no name: the single answer wins; none is service-not-found")
    func resolveSingleOrNone() async throws {
        try Self.prerequisites()
        let link = try await VethLink.create()
        defer { Task { await link.remove() } }
        let browser = NetworkBrowser(for: .dnssd(type: "_qxfer._udp"), interfaces: [link.leftInterface])
        let none = await qxferError { _ = try await browser.resolve(timeout: .seconds(2)) }
        #expect(none?.code == .serviceNotFound)
        let names = Recorder<String>()
        let service = DNSSDService(name: "qx only", type: "_qxfer._udp", port: 6001)
        let endpoint = try await withAdvertiser(NetworkAdvertiser(service, interfaces: [link.leftInterface]), registered: { names.append($0) }) {
            #expect(await Self.waitForNames(names, count: 1))
            return try await browser.resolve(timeout: .seconds(5))
        }
        await link.remove()
        #expect(endpoint.service?.name == "qx only" && endpoint.port == 6001)
        // Every socket the browsers and the advertiser opened is closed by now.
        #expect(Self.udpSocketCount(port: MDNS.port) == 0)
    }

    /// The UDP sockets of this process bound to `port`, from /proc (as `socketCount` does for TCP).
    static func udpSocketCount(port: UInt16) -> Int {
        var inodes = Set<Substring>()
        for table in ["/proc/net/udp", "/proc/net/udp6"] {
            guard let handle = FileHandle(forReadingAtPath: table), let data = try? handle.readToEnd() else { continue }
            try? handle.close()
            for line in String(decoding: data, as: UTF8.self).split(separator: "\n").dropFirst() {
                let fields = line.split(separator: " ")
                guard fields.count > 9 else { continue }
                if fields[1].split(separator: ":").last.flatMap({ UInt16($0, radix: 16) }) == port { inodes.insert(fields[9]) }
            }
        }
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return entries.filter { entry in
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + entry) else { return false }
            return target.hasPrefix("socket:[") && inodes.contains(target.dropFirst("socket:[".count).dropLast())
        }.count
    }

    /// The `qxfer` built beside this test bundle.
    static var qxferExecutable: String? {
        let directory = URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL.deletingLastPathComponent()
        for candidate in [directory, directory.deletingLastPathComponent()] {
            let path = candidate.appendingPathComponent("qxfer").path
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }

    @Test("qxfer browse --json in one namespace lists a service python-zeroconf publishes in another, then its removal")
    func cliBrowseAcrossNamespaces() async throws {
        try Self.prerequisites()
        let qxfer = try #require(Self.qxferExecutable, "the qxfer executable was not found next to the tests")
        let link = try await VethLink.create(twoNamespaces: true)
        defer { Task { await link.remove() } }
        let scratch = TemporaryDirectory()
        let script = try Zeroconf.script(Zeroconf.publishScript, in: scratch, named: "publish.py")
        async let browsing = link.run(in: link.leftNamespace, qxfer, ["browse", "--json", "--timeout", "7"])
        async let publishing = link.run(in: link.rightNamespace, Zeroconf.python, [script, link.rightAddress, "zc-cli", "7002", Self.fingerprint, "3"])
        let (browse, publish) = try await (browsing, publishing)
        #expect(publish.stdout.contains("unregistered"), "\(publish.stderr)")
        await link.remove()
        #expect(browse.status == 0, "\(browse.stderr)")
        let events = browse.stdout.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        #expect(events.map { $0["event"] as? String } == ["added", "removed"], "\(browse.stdout)")
        let added = try #require(events.first)
        #expect(added["name"] as? String == "zc-cli")
        #expect(added["port"] as? Int == 7002)
        #expect(added["fingerprint"] as? String == Self.fingerprint)
        #expect(added["addresses"] as? [String] == [link.rightAddress])
    }
}
