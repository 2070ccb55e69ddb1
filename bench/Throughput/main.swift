// qxfer-bench: bulk throughput of one qxfer connection, QUIC or TCP+TLS, between two processes.
//
//     qxfer-bench sink   --stack quic|tls --port P [--host H] [--cc cubic|bbr|bbr2|reno] [--connections N]
//     qxfer-bench source --stack quic|tls HOST PORT --bytes N [--fingerprint FP] [--cc cubic|bbr|bbr2|reno]
//
// The sink prints its identity's fingerprint on its first stdout line and `listening on H:P` on
// the second, then reads and discards everything a client sends until the client finishes its
// sending direction, and answers with the byte count (UInt64, big-endian). After N connections
// (default 1; 0 means forever) it prints one JSON line about the last one and exits.
//
// The source connects (pinning --fingerprint when given), sends N bytes in 1 MiB chunks, finishes,
// waits for the sink's count, checks it, and prints one JSON line: stack, bytes, seconds (from
// before the connection starts until the count arrives, handshake included), MB/s (10^6 bytes per
// second) and the connection's metrics. Both sides use ephemeral identities and the bulk
// performance mode. Exit status 0 only if the count matches.
import Foundation
import QXfer

#if canImport(Glibc)
import Glibc
#endif

struct Usage: Error, CustomStringConvertible {
    let description: String
}

/// Command-line options: `--name value` pairs and positional arguments.
struct Options {
    var named: [String: String] = [:]
    var positional: [String] = []

    init(_ arguments: ArraySlice<String>) throws {
        var rest = arguments
        while let argument = rest.popFirst() {
            if argument.hasPrefix("--") {
                let name = String(argument.dropFirst(2))
                if let equals = name.firstIndex(of: "=") {
                    named[String(name[..<equals])] = String(name[name.index(after: equals)...])
                } else {
                    guard let value = rest.popFirst() else { throw Usage(description: "\(argument) needs a value") }
                    named[name] = value
                }
            } else {
                positional.append(argument)
            }
        }
    }

    func string(_ name: String) -> String? { named[name] }

    func integer(_ name: String) throws -> Int? {
        guard let text = named[name] else { return nil }
        guard let value = parseSize(text) else { throw Usage(description: "--\(name): not a size: \(text)") }
        return value
    }
}

/// "1073741824", "1GiB", "256MiB", "64k", "1G" (binary units).
func parseSize(_ text: String) -> Int? {
    let lower = text.lowercased()
    let units: [(String, Int)] = [("gib", 1 << 30), ("mib", 1 << 20), ("kib", 1 << 10), ("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)]
    for (suffix, factor) in units where lower.hasSuffix(suffix) {
        return Int(lower.dropLast(suffix.count)).map { $0 * factor }
    }
    return Int(lower)
}

enum Stack: String {
    case quic, tls
}

func congestionControl(_ options: Options) throws -> CongestionControl? {
    switch options.string("cc") {
    case nil: return nil
    case "cubic": return .cubic
    case "bbr": return .bbr
    case "bbr2": return .bbr2
    case "reno": return .reno
    case let other?: throw Usage(description: "--cc: cubic, bbr, bbr2 or reno, not \(other)")
    }
}

func applied<S>(_ parameters: NetworkParameters<S>, _ cc: CongestionControl?) -> NetworkParameters<S> {
    let bulk = parameters.performanceMode(.bulk)
    return cc.map { bulk.congestionControl($0) } ?? bulk
}

func seconds(_ duration: Duration) -> Double {
    let (whole, attoseconds) = duration.components
    return Double(whole) + Double(attoseconds) / 1e18
}

/// One line on stdout, unbuffered: the bench script reads the sink's first lines while it runs.
func printLine(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

func json(_ object: [String: Any]) -> String {
    let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
    return String(decoding: data, as: UTF8.self)
}

func metricsObject(_ metrics: ConnectionMetrics) -> [String: Any] {
    var object: [String: Any] = [:]
    func microseconds(_ duration: Duration?) -> Any { duration.map { Int(seconds($0) * 1e6) } ?? NSNull() }
    func value(_ value: Int?) -> Any { value ?? NSNull() }
    object["srtt_us"] = microseconds(metrics.smoothedRTT)
    object["rttvar_us"] = microseconds(metrics.rttVariance)
    object["min_rtt_us"] = microseconds(metrics.minimumRTT)
    object["cwnd"] = value(metrics.congestionWindow)
    object["bytes_in_flight"] = value(metrics.bytesInFlight)
    object["delivery_rate"] = value(metrics.deliveryRate)
    object["packets_lost"] = value(metrics.packetsLost)
    object["packets_retransmitted"] = value(metrics.packetsRetransmitted)
    object["bytes_sent"] = value(metrics.bytesSent)
    object["bytes_received"] = value(metrics.bytesReceived)
    return object
}

/// Results a sink's handlers hand to the main task.
final class SinkResults: @unchecked Sendable {
    // Every access holds `lock`.
    private let lock = NSLock()
    private var lines: [String] = []
    func append(_ line: String) { lock.withLock { lines.append(line) } }
    var all: [String] { lock.withLock { lines } }
}

// MARK: - Sink

func runSink<S: ByteStreamProtocol>(_ parameters: NetworkParameters<S>, stackName: String, fingerprint: Fingerprint,
                                    host: String?, port: UInt16, connections: Int) async throws {
    let listener = NetworkListener(on: port, host: host, using: parameters)
    let (done, doneContinuation) = AsyncStream.makeStream(of: String.self)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask {
            try await listener.run { connection in
                let clock = ContinuousClock()
                var started: ContinuousClock.Instant?
                var total: UInt64 = 0
                do {
                    while true {
                        let chunk = try await connection.receive(atLeast: 1, atMost: 1 << 20).content
                        if started == nil { started = clock.now }
                        total += UInt64(chunk.count)
                    }
                } catch let error as QXferError where error.code == .endOfStream {
                    // The client finished: answer with the count.
                }
                let elapsed = started.map { seconds(clock.now - $0) } ?? 0
                let metrics = await connection.metrics
                try await connection.send(withUnsafeBytes(of: total.bigEndian) { Data($0) })
                // Returning closes the connection at once, which could cut off the count on
                // QUIC: wait (bounded) for the client to close after reading it.
                let states = connection.states
                let waiter = Task {
                    for await state in states {
                        switch state {
                        case .failed, .cancelled: return
                        default: continue
                        }
                    }
                }
                let timer = Task {
                    try? await Task.sleep(for: .seconds(10))
                    waiter.cancel()
                }
                await waiter.value
                timer.cancel()
                doneContinuation.yield(json([
                    "role": "sink", "stack": stackName, "bytes": total, "seconds": elapsed,
                    "MBps": elapsed > 0 ? Double(total) / elapsed / 1e6 : 0, "metrics": metricsObject(metrics),
                ]))
            }
        }
        let bound = try await listener.port
        printLine(fingerprint.description)
        printLine("listening on \(host ?? "*"):\(bound)")
        var served = 0
        for await line in done {
            served += 1
            printLine(line)
            if connections > 0 && served >= connections { break }
        }
        group.cancelAll()
    }
}

// MARK: - Source

func runSource<S: ByteStreamProtocol>(_ parameters: NetworkParameters<S>, stackName: String,
                                      host: String, port: UInt16, bytes: Int) async throws -> Bool {
    let clock = ContinuousClock()
    let started = clock.now
    let connection = NetworkConnection(to: .hostPort(host: host, port: port), using: parameters)
    defer { connection.cancel() }
    let chunkSize = 1 << 20
    let chunk = Data((0..<chunkSize).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 11) })
    var remaining = bytes
    while remaining > 0 {
        let count = min(remaining, chunkSize)
        try await connection.send(count == chunkSize ? chunk : chunk.prefix(count))
        remaining -= count
    }
    try await connection.finish()
    let reply = try await connection.receive(exactly: 8).content
    let elapsed = seconds(clock.now - started)
    let counted = reply.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
    let metrics = await connection.metrics
    printLine(json([
        "role": "source", "stack": stackName, "bytes": bytes, "seconds": elapsed,
        "MBps": Double(bytes) / elapsed / 1e6, "sink_counted": counted, "metrics": metricsObject(metrics),
    ]))
    if counted != UInt64(bytes) {
        FileHandle.standardError.write(Data("qxfer-bench: the sink counted \(counted) bytes, \(bytes) were sent\n".utf8))
        return false
    }
    return true
}

// MARK: - Main

let usage = """
    usage: qxfer-bench sink   --stack quic|tls --port P [--host H] [--cc cubic|bbr] [--connections N]
           qxfer-bench source --stack quic|tls HOST PORT --bytes N [--fingerprint FP] [--cc cubic|bbr]
    """

func main() async -> Int32 {
    let arguments = CommandLine.arguments
    guard arguments.count >= 2, ["sink", "source"].contains(arguments[1]) else {
        FileHandle.standardError.write(Data((usage + "\n").utf8))
        return 2
    }
    do {
        let options = try Options(arguments.dropFirst(2))
        guard let stack = Stack(rawValue: options.string("stack") ?? "quic") else {
            throw Usage(description: "--stack: quic or tls")
        }
        let cc = try congestionControl(options)
        let identity = try HostIdentity.ephemeral(commonName: "qxfer-bench \(arguments[1])")
        if arguments[1] == "sink" {
            guard let port = UInt16(options.string("port") ?? "") else { throw Usage(description: "sink needs --port P (0: any)") }
            let connections = try options.integer("connections") ?? 1
            let host = options.string("host")
            switch stack {
            case .quic:
                try await runSink(applied(.parameters { QUIC().identity(identity) }, cc), stackName: "quic",
                                  fingerprint: identity.fingerprint, host: host, port: port, connections: connections)
            case .tls:
                try await runSink(applied(.parameters { TLS().identity(identity) }, cc), stackName: "tls",
                                  fingerprint: identity.fingerprint, host: host, port: port, connections: connections)
            }
            return 0
        }
        guard options.positional.count == 2, let port = UInt16(options.positional[1]) else {
            throw Usage(description: "source needs HOST PORT")
        }
        let host = options.positional[0]
        guard let bytes = try options.integer("bytes"), bytes >= 0 else { throw Usage(description: "source needs --bytes N") }
        var quic = QUIC().identity(identity)
        var tls = TLS().identity(identity)
        // Without a pin: trust on first use in a throwaway known-hosts file, so a benchmark never
        // writes to the user's own.
        let knownHosts = KnownHosts(path: FileManager.default.temporaryDirectory
            .appendingPathComponent("qxfer-bench-known-hosts-\(getpid())").path)
        defer { try? FileManager.default.removeItem(atPath: knownHosts.path) }
        if let text = options.string("fingerprint") {
            guard let fingerprint = Fingerprint(parsing: text) else { throw Usage(description: "--fingerprint: not a SHA-256 fingerprint") }
            quic = quic.peerFingerprint(fingerprint)
            tls = tls.peerFingerprint(fingerprint)
        } else {
            quic = quic.peerTrust(.knownHosts(knownHosts))
            tls = tls.peerTrust(.knownHosts(knownHosts))
        }
        let ok: Bool
        switch stack {
        case .quic:
            let configured = quic
            ok = try await runSource(applied(.parameters { configured }, cc), stackName: "quic", host: host, port: port, bytes: bytes)
        case .tls:
            let configured = tls
            ok = try await runSource(applied(.parameters { configured }, cc), stackName: "tls", host: host, port: port, bytes: bytes)
        }
        return ok ? 0 : 1
    } catch let error as Usage {
        FileHandle.standardError.write(Data("qxfer-bench: \(error)\n\(usage)\n".utf8))
        return 2
    } catch {
        FileHandle.standardError.write(Data("qxfer-bench: \(error)\n".utf8))
        return 1
    }
}

exit(await main())
