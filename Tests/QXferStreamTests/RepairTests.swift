import Foundation
import Testing
@testable import QXferStream

/// Reed–Solomon, the shard layout, and realtime repair (FEC and NACK) over a simulated lossy
/// link: sans-IO values driven by a virtual clock and a seeded random number generator.
@Suite struct RepairTests {
    @Test func reedSolomonRebuildsAnyKOfKPlusM() throws {
        var random = SeededRandom(seed: 42)
        for (k, m) in [(1, 1), (4, 2), (12, 3), (32, 5), (200, 56)] {
            let data = (0..<k).map { _ in (0..<97).map { _ in UInt8.random(in: 0...255, using: &random) } }
            let parity = ReedSolomon.parity(data: data, parityCount: m)
            #expect(parity.count == m)
            for _ in 0..<20 {
                let erased = Set((0..<(k + m)).shuffled(using: &random).prefix(m))
                var shards: [Int: [UInt8]] = [:]
                for index in 0..<(k + m) where !erased.contains(index) {
                    shards[index] = index < k ? data[index] : parity[index - k]
                }
                let rebuilt = try #require(ReedSolomon.reconstruct(shards: shards, k: k, m: m), "k=\(k) m=\(m) erased \(erased)")
                #expect(rebuilt == data, "k=\(k) m=\(m) erased \(erased)")
            }
            // One shard too few cannot be rebuilt.
            var tooFew: [Int: [UInt8]] = [:]
            for index in m + 1..<k + m { tooFew[index] = index < k ? data[index] : parity[index - k] }
            if k > 1 { #expect(ReedSolomon.reconstruct(shards: tooFew, k: k, m: m) == nil) }
        }
    }

    @Test func galoisFieldInverses() {
        for a in 1...255 {
            #expect(GaloisField.multiply(UInt8(a), GaloisField.inverse(UInt8(a))) == 1)
        }
    }

    @Test func layoutCoversTheFrameExactlyOnce() {
        for (length, size) in [(0, 1000), (1, 1000), (1000, 1000), (1001, 1000), (100_000, 1157), (5_000_000, 1157)] {
            let layout = ShardLayout(frameLength: length, shardSize: size)
            var covered = 0
            var expectedStart = 0
            for block in 0..<layout.blockCount {
                #expect(layout.dataShards(inBlock: block) <= ShardLayout.maximumBlockDataShards)
                for shard in 0..<layout.dataShards(inBlock: block) {
                    let range = layout.dataRange(block: block, shard: shard)
                    #expect(range.lowerBound == expectedStart)
                    expectedStart = range.upperBound
                    covered += range.count
                }
            }
            #expect(covered == length, "length \(length) size \(size)")
        }
    }

    @Test func hostileShardHeadersAreRefused() {
        let frame = Frame(index: 3, isKeyframe: true, captureTime: 1_000, deadline: .milliseconds(100), payload: Data(count: 5000))
        var sender = RealtimeSender(repair: .fec)
        let good = sender.datagrams(for: frame, maximumDatagramSize: 1200, now: 0)
        #expect(good.count > 5)
        for datagram in good { #expect(throws: Never.self) { try RealtimeDatagram.decode(datagram) } }
        // Truncated header, a wrong payload size, a block past the layout, unknown type.
        var wrongSize = good[0]
        wrongSize.append(0)
        var badBlock = good[0]
        badBlock[badBlock.startIndex + 36] = 0x7F
        for hostile in [good[0].prefix(20), wrongSize, badBlock, Data([0x42, 1, 2])] {
            #expect(throws: StreamError.self) { try RealtimeDatagram.decode(Data(hostile)) }
        }
        var assembler = FrameAssembler(configuration: .init(repair: .fec))
        let result = assembler.receive(Data([0x10, 0, 0]), now: 0)
        #expect(result.events.isEmpty && assembler.counters.malformed == 1)
    }

    @Test func nackDatagramsRoundTrip() throws {
        let missing = [ShardAddress(block: 0, shard: 3), ShardAddress(block: 2, shard: 31)]
        for datagram in [RealtimeDatagram.nack(frame: 77, missing: missing), .nack(frame: 1 << 40, missing: nil)] {
            #expect(try RealtimeDatagram.decode(datagram.encoded()) == datagram)
        }
    }

    /// The sender's warm-up padding: the size asked for, zeros only, ignored (and counted) by
    /// the receiver without disturbing reassembly.
    @Test func paddingIsSizedZeroAndIgnored() throws {
        let padding = RealtimeDatagram.padding(byteCount: 1200).encoded()
        #expect(padding.count == 1200 && padding.first == 0x12)
        #expect(try RealtimeDatagram.decode(padding) == .padding(byteCount: 1200))
        var carrying = padding
        carrying[carrying.startIndex + 600] = 1
        #expect(throws: StreamError.self) { try RealtimeDatagram.decode(carrying) }

        var assembler = FrameAssembler(configuration: .init(repair: .both))
        var sender = RealtimeSender(repair: .both)
        let frame = Frame(index: 0, isKeyframe: true, captureTime: 0, deadline: .milliseconds(100), payload: Data((0..<3000).map { UInt8($0 % 251) }))
        var completed: [Frame] = []
        for datagram in [padding, padding] + sender.datagrams(for: frame, maximumDatagramSize: 1200, now: 0) {
            let (events, requests) = assembler.receive(datagram, now: 1_000_000)
            #expect(requests.isEmpty)
            for case .completed(let whole, _) in events { completed.append(whole) }
        }
        #expect(completed.map(\.payload) == [frame.payload])
        #expect(assembler.counters.padding == 2 && assembler.counters.malformed == 0)
    }

    @Test func strictnessOfDatagrams() throws {
        // Unknown flag bits, and bytes after a NACK's last entry, are refused.
        let frame = Frame(index: 1, isKeyframe: false, captureTime: 0, deadline: .milliseconds(100), payload: Data(count: 10))
        var sender = RealtimeSender(repair: .none)
        var shard = try #require(sender.datagrams(for: frame, maximumDatagramSize: 1200, now: 0).first)
        shard[shard.startIndex + 33] |= 0x80
        #expect(throws: StreamError.self) { try RealtimeDatagram.decode(shard) }
        #expect(throws: StreamError.self) { try RealtimeDatagram.decode(RealtimeDatagram.nack(frame: 1, missing: []).encoded() + Data([0])) }
        #expect(throws: StreamError.self) { try RealtimeDatagram.decode(RealtimeDatagram.nack(frame: 1, missing: nil).encoded() + Data([0x0d])) }
    }

    /// A sender (authenticated, but hostile or broken) that jumps to the largest frame index and
    /// back, or far ahead, must cost the receiver neither a trap nor a loop over the gap.
    @Test func extremeFrameIndicesNeitherTrapNorLoop() {
        var assembler = FrameAssembler(configuration: .init(repair: .both))
        var sender = RealtimeSender(repair: .none)
        let now: UInt64 = 1_000_000_000
        for index: UInt64 in [0, 3, 5, 1 << 62, .max, 7, .max - 1, 1] {
            let frame = Frame(index: index, isKeyframe: false, captureTime: now, deadline: .milliseconds(100), payload: Data(count: 3000))
            for datagram in sender.datagrams(for: frame, maximumDatagramSize: 1200, now: now) {
                _ = assembler.receive(datagram, now: now)
            }
        }
        let (events, requests) = assembler.tick(now: now + 1_000_000)
        #expect(requests.count <= 256 + 8, "\(requests.count) requests")
        #expect(events.count <= 256 + 8)
    }

    /// Announced bytes of the frames in reassembly are bounded, whatever frame lengths say.
    @Test func bytesInProgressAreBounded() {
        var configuration = FrameAssembler.Configuration(repair: .fec)
        configuration.maximumBytesInProgress = 1 << 20
        var assembler = FrameAssembler(configuration: configuration)
        var sender = RealtimeSender(repair: .none)
        for index: UInt64 in 0..<40 {
            // The first shard of each 100 kB frame only: every frame stays incomplete.
            let frame = Frame(index: index, isKeyframe: true, captureTime: 0, deadline: .seconds(10), payload: Data(count: 100_000))
            _ = assembler.receive(sender.datagrams(for: frame, maximumDatagramSize: 1200, now: 0)[0], now: 0)
        }
        #expect(assembler.framesInProgress == 10, "\(assembler.framesInProgress) frames of 100 kB kept under a 1 MiB bound")
    }

    /// Runs a realtime stream through a simulated link and returns what the receiver counted.
    func simulate(repair: RepairScheme, loss: Double, seed: UInt64, frames: Int = 600) -> SimulationResult {
        var link = SimulatedLink(oneWayDelay: 25_000_000, loss: loss, seed: seed)
        var sender = RealtimeSender(repair: repair)
        var assembler = FrameAssembler(configuration: .init(repair: repair))
        assembler.configuration.retryInterval = 60_000_000
        var source = SyntheticSource(frameRate: FrameRate(numerator: 30), bitsPerSecond: 4_000_000, seed: seed)
        let deadline: Duration = .milliseconds(150)
        var result = SimulationResult()
        var now: UInt64 = 1_000_000_000
        var nextFrameAt = now
        var index: UInt64 = 0
        var playout = PlayoutBuffer()
        let end = now + UInt64(frames) * 33_333_333 + 1_000_000_000
        while now < end {
            if index < UInt64(frames) && now >= nextFrameAt {
                let next = try! source.next()!
                let frame = Frame(index: index, isKeyframe: next.isKeyframe, captureTime: now, deadline: deadline, payload: next.payload)
                result.sent[index] = frame.payload
                for datagram in sender.datagrams(for: frame, maximumDatagramSize: 1200, now: now) {
                    link.send(datagram, toReceiver: true, now: now)
                }
                index += 1
                nextFrameAt += 33_333_333
            }
            for (datagram, toReceiver) in link.deliver(now: now) {
                if toReceiver {
                    let (events, requests) = assembler.receive(datagram, now: now)
                    result.record(events, now: now, playout: &playout)
                    for request in requests { link.send(request, toReceiver: false, now: now) }
                } else if case .nack(let frame, let missing)? = try? RealtimeDatagram.decode(datagram) {
                    for resend in sender.handle(nackFor: frame, missing: missing, now: now) { link.send(resend, toReceiver: true, now: now) }
                }
            }
            let (events, requests) = assembler.tick(now: now)
            result.record(events, now: now, playout: &playout)
            for request in requests { link.send(request, toReceiver: false, now: now) }
            now += 1_000_000  // 1 ms steps
        }
        result.recovered = assembler.counters.blocksRecovered
        result.requested = assembler.counters.shardsRequested
        result.datagramsSent = link.sentToReceiver
        return result
    }

    @Test(arguments: [RepairScheme.fec, .nack, .both])
    func repairKeepsFramesOnTimeUnderOnePercentLoss(repair: RepairScheme) {
        for seed: UInt64 in [1, 2, 3] {
            let result = simulate(repair: repair, loss: 0.01, seed: seed)
            // Everything delivered is byte-identical to what was sent.
            #expect(result.corrupted == 0, "seed \(seed)")
            #expect(result.onTime + result.late <= 600)
            #expect(result.onTime >= 597, "\(repair) seed \(seed): \(result.onTime) of 600 on time, \(result.late) late")
            switch repair {
            case .fec: #expect(result.recovered > 0 && result.requested == 0, "seed \(seed)")
            case .nack: #expect(result.recovered == 0 && result.requested > 0, "seed \(seed)")
            default: break
            }
            #expect(result.playoutInOrder)
        }
    }

    @Test func withoutRepairLossesAreCountedAsLost() {
        let result = simulate(repair: .none, loss: 0.01, seed: 9)
        // About 1 − 0.99^15 ≈ 14 % of frames lose a datagram; none is repaired or invented.
        #expect(result.onTime < 570 && result.onTime > 400, "\(result.onTime) on time")
        #expect(result.late == 0)
        #expect(result.corrupted == 0)
        #expect(result.gaps == 600 - result.onTime)
    }

    @Test func nackRepairArrivesAfterARoundTripFecWithout() {
        let fec = simulate(repair: .fec, loss: 0.02, seed: 5)
        let nack = simulate(repair: .nack, loss: 0.02, seed: 5)
        // The simulated path is 25 ms each way: a repaired frame under NACK waits at least one
        // more round trip (50 ms); under FEC it waits for nothing but its own parity.
        #expect(fec.latencies.max()! < 40_000_000)
        #expect(nack.latencies.max()! >= 75_000_000)
        // And FEC spends bandwidth on parity whether or not anything is lost.
        #expect(fec.datagramsSent > nack.datagramsSent)
    }

    @Test func playoutSkipsWhatWillNotComeAndKeepsOrder() {
        var playout = PlayoutBuffer()
        func frame(_ index: UInt64, expiry: UInt64) -> Frame {
            Frame(index: index, isKeyframe: false, captureTime: expiry - 100, deadline: .nanoseconds(100), payload: Data())
        }
        var added = playout.add(frame(1, expiry: 1000))
        #expect(added)
        var released = playout.release(now: 500)
        #expect(released.isEmpty)  // 0 may still come
        released = playout.release(now: 1000)
        #expect(released == [.gap(0), .frame(frame(1, expiry: 1000))])
        added = playout.add(frame(0, expiry: 900))
        #expect(!added)  // its place has passed
        playout.giveUp(2)
        added = playout.add(frame(3, expiry: 5000))
        #expect(added)
        released = playout.release(now: 1100)
        #expect(released == [.gap(2), .frame(frame(3, expiry: 5000))])
        released = playout.release(now: 1200, through: 6)
        #expect(released == [.gap(4), .gap(5)])
    }
}

struct SimulationResult {
    var sent: [UInt64: Data] = [:]
    var onTime = 0
    var late = 0
    var corrupted = 0
    var gaps = 0
    var recovered = 0
    var requested = 0
    var datagramsSent = 0
    var latencies: [UInt64] = []
    var playoutInOrder = true
    private var lastPlayed: UInt64?

    mutating func record(_ events: [FrameAssembler.Event], now: UInt64, playout: inout PlayoutBuffer) {
        for event in events {
            switch event {
            case .completed(let frame, let isOnTime):
                if sent[frame.index] != frame.payload { corrupted += 1 }
                if isOnTime { onTime += 1; playout.add(frame) } else { late += 1 }
                latencies.append(now - frame.captureTime)
            case .expired(let index): playout.giveUp(index)
            }
        }
        for item in playout.release(now: now) {
            let index: UInt64
            switch item {
            case .frame(let frame): index = frame.index
            case .gap(let missing):
                index = missing
                gaps += 1
            }
            if let lastPlayed, index != lastPlayed + 1 { playoutInOrder = false }
            lastPlayed = index
        }
    }
}

/// A two-way link with a fixed delay and independent random loss, in virtual time.
struct SimulatedLink {
    let oneWayDelay: UInt64
    let loss: Double
    var random: SeededRandom
    var inFlight: [(arrival: UInt64, datagram: Data, toReceiver: Bool)] = []
    var sentToReceiver = 0

    init(oneWayDelay: UInt64, loss: Double, seed: UInt64) {
        self.oneWayDelay = oneWayDelay
        self.loss = loss
        self.random = SeededRandom(seed: seed)
    }

    mutating func send(_ datagram: Data, toReceiver: Bool, now: UInt64) {
        if toReceiver { sentToReceiver += 1 }
        guard Double.random(in: 0..<1, using: &random) >= loss else { return }
        inFlight.append((now + oneWayDelay, datagram, toReceiver))
    }

    mutating func deliver(now: UInt64) -> [(Data, Bool)] {
        let due = inFlight.filter { $0.arrival <= now }
        inFlight.removeAll { $0.arrival <= now }
        return due.map { ($0.datagram, $0.toReceiver) }
    }
}

/// SplitMix64: reproducible randomness for tests.
struct SeededRandom: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
