import QUICEngine
import Testing

/// Sends `size` pattern bytes client → server on each of `streamCount` streams, and reads
/// and verifies them at the server as they arrive.
final class BulkTransfer {
    let sim: Simulation
    let pattern: Pattern
    let size: Int
    var sent: [QUICStreamID: Int] = [:]
    var received: [QUICStreamID: Int] = [:]
    var finished: Set<QUICStreamID> = []
    var corrupt = false
    /// Server reads at most this many bytes per step (nil = everything).
    var readBudgetPerStep: Int?
    /// Largest number of bytes the server engine held for the application at any step.
    var maxBufferedAtServer = 0
    /// Largest number of unacknowledged bytes the client engine held for one stream.
    var maxBufferedAtClient = 0
    /// Largest number of unacknowledged bytes the client engine held for all streams together.
    var maxBufferedAtClientInAll = 0
    /// Server application reads at most this many bytes per virtual second (nil = as fast as data comes).
    var readRate: UInt64?
    private var readCredit: Double = 0
    private var lastStep: UInt64?
    /// Called once when the server has received `trigger.bytes` in total.
    var trigger: (bytes: Int, action: () -> Void)?
    let streamCount: Int
    private var pendingOpen: Int
    /// As qxfer's driver: after a short write, write to that stream again only once the engine
    /// reports it writable (otherwise the sender offers bytes at every step).
    var writerWaitsForWritable = false
    private var waitingForWritable: Set<QUICStreamID> = []

    init(sim: Simulation, size: Int, streams: Int = 1) {
        self.sim = sim
        self.size = size
        self.streamCount = streams
        self.pendingOpen = streams
        self.pattern = Pattern(seed: sim.seed)
        sim.onStep = { [unowned self] in self.step() }
        let earlier = sim.onEvent
        sim.onEvent = { [unowned self] side, event in
            earlier?(side, event)
            if side == .client, case .streamWritable(let id) = event { self.waitingForWritable.remove(id) }
        }
    }

    var complete: Bool { finished.count == streamCount }

    private func step() {
        let client = sim.client
        guard client.isHandshakeComplete, !client.isClosed else { return }
        while pendingOpen > 0, let id = try? client.openStream() {
            sent[id] = 0
            pendingOpen -= 1
        }
        for (id, offset) in sent where offset < size && !waitingForWritable.contains(id) {
            var o = offset
            while o < size {
                var offered = 0
                let n = pattern.withBytes(at: o, maxLength: min(64 << 10, size - o)) { chunk in
                    offered = chunk.count
                    return (try? client.write(stream: id, bytes: chunk, finish: o + chunk.count == size)) ?? 0
                }
                o += n
                if n < offered {
                    if writerWaitsForWritable { waitingForWritable.insert(id) }
                    break
                }
            }
            sent[id] = o
        }
        for id in sent.keys { maxBufferedAtClient = max(maxBufferedAtClient, client.bufferedSendBytes(stream: id)) }
        maxBufferedAtClientInAll = max(maxBufferedAtClientInAll, sent.keys.reduce(0) { $0 + client.bufferedSendBytes(stream: $1) })
        guard let server = sim.server else { return }
        maxBufferedAtServer = max(maxBufferedAtServer, server.totalReadableBytes)
        var budget = readBudgetPerStep ?? .max
        if let readRate {
            if let lastStep { readCredit += Double(sim.now - lastStep) * Double(readRate) / 1e9 }
            lastStep = sim.now
            budget = min(budget, Int(readCredit))
        }
        let before = budget
        for id in server.openStreams where !finished.contains(id) && budget > 0 {
            guard let r = try? server.read(stream: id, maxLength: budget) else { continue }
            budget -= r.bytes.count
            let offset = received[id, default: 0]
            if !r.bytes.isEmpty && !pattern.matches(r.bytes, at: offset) { corrupt = true }
            received[id] = offset + r.bytes.count
            if r.isFinished { finished.insert(id) }
        }
        if readRate != nil { readCredit -= Double(before - budget) }
        if let (bytes, action) = trigger, received.values.reduce(0, +) >= bytes {
            trigger = nil
            action()
        }
    }
}

@Suite(.serialized) struct TransferTests {
    static func run(seed: UInt64, size: Int, loss: Double, cc: QUICConfiguration.CongestionControl = .cubic,
                    timeLimit: UInt64 = 600_000 * ms, loopback: Bool = false) throws -> (Simulation, BulkTransfer) {
        var clientConfig = QUICConfiguration.test(.client, expectPeer: .server)
        clientConfig.congestionControl = cc
        var serverConfig = QUICConfiguration.test(.server, expectPeer: nil)
        serverConfig.congestionControl = cc
        let sim = try Simulation(seed: seed, client: clientConfig, server: serverConfig, loopback: loopback)
        for direction in [\Simulation.up, \Simulation.down] {
            if loopback { sim[keyPath: direction].mtu = 65_536 }
            sim[keyPath: direction].loss = loss
            sim[keyPath: direction].delay = 10 * ms
            sim[keyPath: direction].jitter = 2 * ms
            sim[keyPath: direction].duplication = 0.01
            sim[keyPath: direction].rate = 200_000_000
        }
        let transfer = BulkTransfer(sim: sim, size: size)
        sim.run(for: timeLimit) { transfer.complete || sim.client.isClosed }
        return (sim, transfer)
    }

    static func check(_ sim: Simulation, _ t: BulkTransfer, size: Int, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(t.complete, "seed \(sim.seed): received \(t.received) of \(size)", sourceLocation: sourceLocation)
        #expect(!t.corrupt, "seed \(sim.seed): data mismatch", sourceLocation: sourceLocation)
        #expect(t.received.values.allSatisfy { $0 == size }, "seed \(sim.seed)", sourceLocation: sourceLocation)
        #expect(sim.closeReason(.client) == nil, "seed \(sim.seed): \(String(describing: sim.closeReason(.client)))",
                sourceLocation: sourceLocation)
    }

    @Test(arguments: [11, 12, 13] as [UInt64])
    func tenMiBWithoutLoss(seed: UInt64) throws {
        let (sim, t) = try Self.run(seed: seed, size: 10 << 20, loss: 0)
        Self.check(sim, t, size: 10 << 20)
    }

    @Test(arguments: [21, 22, 23] as [UInt64])
    func tenMiBWithFivePercentLoss(seed: UInt64) throws {
        let (sim, t) = try Self.run(seed: seed, size: 10 << 20, loss: 0.05)
        Self.check(sim, t, size: 10 << 20)
        #expect(sim.client.stats.streamPacketsLost > 0, "seed \(seed): loss should have been detected")
    }

    @Test(arguments: [31, 32, 33] as [UInt64])
    func tenMiBWithTwentyPercentLoss(seed: UInt64) throws {
        let (sim, t) = try Self.run(seed: seed, size: 10 << 20, loss: 0.20)
        Self.check(sim, t, size: 10 << 20)
    }

    /// Towards a loopback address the engine sends 65 000-byte packets (the loopback interface
    /// has no router to drop them); elsewhere at most ngtcp2's 1452. Every GSO batch stays within
    /// Linux's limits for one send: 64 segments, 64 000 bytes.
    @Test(arguments: [false, true])
    func packetSizeFollowsThePath(loopback: Bool) throws {
        let (sim, t) = try Self.run(seed: 61, size: 10 << 20, loss: 0.01, loopback: loopback)
        Self.check(sim, t, size: 10 << 20)
        if loopback {
            #expect(sim.maxDatagramSize == 65_000)
        } else {
            #expect(sim.maxDatagramSize <= 1452 && sim.maxSegmentCount > 1)
        }
        #expect(sim.maxSegmentCount <= 64 && sim.maxBatchBytes <= 64_000)
    }
}
