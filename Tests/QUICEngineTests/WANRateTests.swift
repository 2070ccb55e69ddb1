import QUICEngine
import Testing

/// Bulk transfer over a long fat path (50 ms RTT, 500 Mbit/s, a 50 ms queue, as bench/'s
/// emulated WAN) in virtual time: the delivery rate the engine reports must stay near the
/// link's, and the transfer must move at a good share of it, with and without random loss.
///
/// The simulation polls `pollTransmit` in a loop at one instant until it returns nil, as the
/// NIO driver does. Before the engine carried its pacing debt from batch to batch, that loop
/// let the whole congestion window out at once and ngtcp2 0.12's rate sampler reported about
/// twice the link's rate (docs/benchmarks.md, "Why QUIC overshot the emulated WAN").
@Suite(.serialized) struct WANRateTests {
    static let linkBitsPerSecond: UInt64 = 500_000_000
    static var linkBytesPerSecond: Double { Double(linkBitsPerSecond) / 8 }

    struct Outcome {
        var maxDeliveryRate: UInt64 = 0
        /// Most bytes the sender handed out at one virtual instant (one turn of the poll loop).
        var maxBytesAtOneInstant = 0
        var goodputBytesPerSecond: Double = 0
        var droppedAtQueueOrLoss = 0
    }

    /// As qxfer's bulk mode (QUICStackConfiguration.make): BBR v2 and the bulk limits.
    static func bulk(_ base: QUICConfiguration) -> QUICConfiguration {
        var c = base
        c.congestionControl = .bbr2
        c.applyBulkTransferLimits()
        return c
    }

    /// The largest delivery rate the sender reported is within 25 % of the link's.
    static func expectEstimateNearLink(_ outcome: Outcome, bitsPerSecond: UInt64 = linkBitsPerSecond,
                                       sourceLocation: SourceLocation = #_sourceLocation) {
        let link = Double(bitsPerSecond) / 8
        #expect(Double(outcome.maxDeliveryRate) <= 1.25 * link,
                "delivery rate \(outcome.maxDeliveryRate) B/s against a link of \(link)",
                sourceLocation: sourceLocation)
    }

    /// At most one in `n` of the packets the sender sent was dropped at the link's queue.
    static func expectDropped(_ outcome: Outcome, _ sim: Simulation, atMostOneIn n: Int,
                              sourceLocation: SourceLocation = #_sourceLocation) {
        let sent = Int(sim.client.stats.packetsSent)
        #expect(outcome.droppedAtQueueOrLoss * n <= sent, "\(outcome.droppedAtQueueOrLoss) of \(sent) packets dropped at the link's queue",
                sourceLocation: sourceLocation)
    }

    static func run(seed: UInt64, loss: Double, size: Int, rtt: UInt64 = 50 * ms, rate: UInt64 = linkBitsPerSecond,
                    queue: UInt64? = nil, jitter: UInt64 = 0) throws -> (Simulation, BulkTransfer, Outcome) {
        let clientConfig = bulk(.test(.client, expectPeer: .server))
        let serverConfig = bulk(.test(.server, expectPeer: nil))
        let sim = try Simulation(seed: seed, client: clientConfig, server: serverConfig)
        for direction in [\Simulation.up, \Simulation.down] {
            sim[keyPath: direction].delay = rtt / 2
            sim[keyPath: direction].rate = rate
            sim[keyPath: direction].maxQueueDelay = queue ?? rtt
            sim[keyPath: direction].loss = loss
            sim[keyPath: direction].jitter = jitter
            sim[keyPath: direction].jitterKeepsOrder = true
        }
        var outcome = Outcome()
        var instant: UInt64 = 0
        var bytesThisInstant = 0
        sim.onTransmit = { side, transmit in
            guard side == .client else { return }
            if sim.now != instant {
                instant = sim.now
                bytesThisInstant = 0
            }
            bytesThisInstant += transmit.data.count
            outcome.maxBytesAtOneInstant = max(outcome.maxBytesAtOneInstant, bytesThisInstant)
        }
        let transfer = BulkTransfer(sim: sim, size: size)
        // As qxfer's driver: a short write waits for the engine's streamWritable event. A writer
        // that offered bytes at every step hid a sender left idle for want of data under loss.
        transfer.writerWaitsForWritable = true
        let applicationStep = sim.onStep
        var start: UInt64?
        sim.onStep = {
            applicationStep?()
            if start == nil, sim.client.isHandshakeComplete { start = sim.now }
            outcome.maxDeliveryRate = max(outcome.maxDeliveryRate, sim.client.stats.deliveryRate)
        }
        sim.run(for: 120_000 * ms) { transfer.complete || sim.client.isClosed }
        let elapsed = Double(sim.now - (start ?? sim.now)) / 1e9
        outcome.goodputBytesPerSecond = elapsed > 0 ? Double(transfer.received.values.reduce(0, +)) / elapsed : 0
        outcome.droppedAtQueueOrLoss = sim.dropped[.server, default: 0]
        return (sim, transfer, outcome)
    }

    /// No loss: the estimate stays within 25 % of the link, batches stay paced, nothing is
    /// dropped at the queue, and 96 MiB take at most 2.05 s of simulated time after the
    /// handshake (1.6 s at the link's 62.5 MB/s, plus the ramp-up): 49 MB/s or more (48.2
    /// while start-up's in-flight cap was 1.25 estimates, letting in flight grow by only a
    /// quarter a round trip).
    @Test func holdsTheLinkRateWithoutLoss() throws {
        let size = 96 << 20
        let (sim, transfer, outcome) = try Self.run(seed: 18, loss: 0, size: size)
        TransferTests.check(sim, transfer, size: size)
        Self.expectEstimateNearLink(outcome)
        // One batch (64 000 bytes) plus what ngtcp2's 1 ms pacing slack lets out at BBR's
        // start-up gain of 2.89 over the link's rate. Unpaced, this was the whole window (8 MB).
        let pacedBurst = 64_000 + Int(2.89 * Self.linkBytesPerSecond / 1000)
        #expect(outcome.maxBytesAtOneInstant <= pacedBurst, "\(outcome.maxBytesAtOneInstant) bytes left at one instant")
        #expect(outcome.droppedAtQueueOrLoss == 0, "\(outcome.droppedAtQueueOrLoss) packets dropped at the link's queue")
        #expect(outcome.goodputBytesPerSecond >= 49e6, "goodput \(outcome.goodputBytesPerSecond) B/s")
    }

    /// 1 % random loss each way: the estimate still stays within 25 % of the link, and 96 MiB
    /// take at most 2.14 s of simulated time after the handshake: 47 MB/s or more, against
    /// 49.3 without loss. (When the bytes a loss pins in the send buffer counted against its
    /// limit, the writer waited for room while the link idled: 27-33 MB/s, and estimates up to
    /// 78 MB/s; with receive windows starting at 4 / 8 MiB instead of 16 / 32, a hole in the
    /// first second stalled the sender on flow control: 41.2 MB/s; with a 16 MiB stream window,
    /// of which ngtcp2 0.12 tops up only half at a time, and a writer woken only for a quarter of
    /// its limit, the sender idled on flow control every few hundred milliseconds: 44.7 MB/s;
    /// with start-up's in-flight cap at 1.25 estimates, 46.3.)
    @Test func holdsTheLinkRateUnderOnePercentLoss() throws {
        let size = 96 << 20
        let (sim, transfer, outcome) = try Self.run(seed: 19, loss: 0.01, size: size)
        TransferTests.check(sim, transfer, size: size)
        Self.expectEstimateNearLink(outcome)
        #expect(outcome.goodputBytesPerSecond >= 47e6, "goodput \(outcome.goodputBytesPerSecond) B/s")
    }

    /// bench/'s wan-lossy path (40 ms RTT, 300 Mbit/s, a 40 ms queue, 0.5 % random loss each
    /// way): 64 MiB at 28 MB/s or more (75 % of the link's 37.5 MB/s, the ramp-up included;
    /// 25-26 MB/s with the loss-pinned bytes counted against the buffer).
    @Test func holdsTheLinkRateOnAShorterLossyPath() throws {
        let size = 64 << 20
        let rate: UInt64 = 300_000_000
        let (sim, transfer, outcome) = try Self.run(seed: 19, loss: 0.005, size: size, rtt: 40 * ms, rate: rate)
        TransferTests.check(sim, transfer, size: size)
        Self.expectEstimateNearLink(outcome, bitsPerSecond: rate)
        #expect(outcome.goodputBytesPerSecond >= 28e6, "goodput \(outcome.goodputBytesPerSecond) B/s")
    }

    /// bench/'s wan-jitter path (each way 20 ms ± 10 ms, order kept, as qxfer-linkemu's
    /// `--jitter`; 200 Mbit/s, a 30 ms queue): 64 MiB at 20.5 MB/s or more (82 % of the link's
    /// 25 MB/s), at most 2 % of the packets dropped at the queue. A busy flow's packets there
    /// take 50-60 ms, the fastest 20-35: with the in-flight cap's products counted in minimum
    /// RTTs alone the cap held less in flight than the pipe needs, and the rate it let through
    /// lowered the next cap: 16.7-18.8 MB/s (seeds 1-3 and this one), 0 dropped.
    @Test func holdsTheLinkRateWhenTheDelayVaries() throws {
        let size = 64 << 20
        let rate: UInt64 = 200_000_000
        let (sim, transfer, outcome) = try Self.run(
            seed: 23, loss: 0, size: size, rtt: 20 * ms, rate: rate, queue: 30 * ms, jitter: 20 * ms)
        TransferTests.check(sim, transfer, size: size)
        Self.expectEstimateNearLink(outcome, bitsPerSecond: rate)
        Self.expectDropped(outcome, sim, atMostOneIn: 50)
        #expect(outcome.goodputBytesPerSecond >= 20.5e6, "goodput \(outcome.goodputBytesPerSecond) B/s")
    }

    /// bench/'s wan-ocean path (300 ms RTT, 200 Mbit/s, a queue of 150 ms: half a
    /// bandwidth-delay product): at most 0.5 % of the packets dropped at the queue, and 256 MiB
    /// at 17.8 MB/s or more (71 % of the link's 25 MB/s, the ramp-up over 300 ms round trips
    /// included). Before the in-flight cap paced its flights, BBR v2 never left start-up under
    /// it and sent each capped flight at 2.77 times the estimate: 20 978 packets dropped (9 %),
    /// 13.9 MB/s; with start-up's cap at 1.25 estimates, 1 353 dropped (0.7 %), 17.5 MB/s.
    @Test func holdsAQueueOfHalfABandwidthDelayProduct() throws {
        let size = 256 << 20
        let rate: UInt64 = 200_000_000
        let (sim, transfer, outcome) = try Self.run(seed: 7, loss: 0, size: size, rtt: 300 * ms, rate: rate, queue: 150 * ms)
        TransferTests.check(sim, transfer, size: size)
        Self.expectEstimateNearLink(outcome, bitsPerSecond: rate)
        Self.expectDropped(outcome, sim, atMostOneIn: 200)
        #expect(outcome.goodputBytesPerSecond >= 17.8e6, "goodput \(outcome.goodputBytesPerSecond) B/s")
    }

    /// bench/'s wan-thin path (80 ms RTT, 10 Mbit/s, a 10 ms queue: 8 full-size packets): at
    /// most 24 000 bytes at one instant (about 2 ms at start-up's pace), at most 20 % of the
    /// packets dropped at the queue (nearly all in start-up, whose gain overshoots any path),
    /// and 4 MiB at 0.9 MB/s or more (72 % of the link's 1.25 MB/s, start-up included). Before
    /// batches were sized to the pacing rate, ngtcp2's send quantum (the pacing rate times the
    /// minimum RTT: 64 KiB here) let 44 packets out at one instant, and start-up paced at
    /// ngtcp2's 40 MB/s whatever the path: 1 497 of 4 586 packets dropped, 0.32 MB/s.
    @Test func holdsAThinLinksShallowQueue() throws {
        let size = 4 << 20
        let rate: UInt64 = 10_000_000
        let (sim, transfer, outcome) = try Self.run(seed: 7, loss: 0, size: size, rtt: 80 * ms, rate: rate, queue: 10 * ms)
        TransferTests.check(sim, transfer, size: size)
        Self.expectEstimateNearLink(outcome, bitsPerSecond: rate)
        #expect(outcome.maxBytesAtOneInstant <= 24_000, "\(outcome.maxBytesAtOneInstant) bytes left at one instant")
        Self.expectDropped(outcome, sim, atMostOneIn: 5)
        #expect(outcome.goodputBytesPerSecond >= 0.9e6, "goodput \(outcome.goodputBytesPerSecond) B/s")
    }

    /// A short path with heavy random loss (40 ms RTT, 50 Mbit/s, a 50 ms queue, 5 or 10 %
    /// loss each way, as a poor radio link): 48 MiB at 5 MB/s or more (80 % of the link's
    /// 6.25). ngtcp2 0.12's BBR v2 cuts its in-flight ceiling after every lossy sample that is
    /// not application-limited; with the in-flight cap's floor at 1 MiB, four times this path's
    /// bandwidth-delay product, every sample was one, and the window fell to a few packets:
    /// 0.9 MB/s at 10 %, 4.9 at 5 % for 16 MiB (docs/benchmarks.md, "Heavy random loss on a
    /// short path"). 48 MiB take BBR v2 past its first ProbeRTT, 5 s in: with the cap's delay
    /// measured while start-up queued, BBR found the pipe full there and the rate fell to
    /// 0.5 MB/s (seeds 2 and 4 of six at 10 %).
    @Test(arguments: [(0.10, 2), (0.10, 4), (0.05, 2)] as [(Double, UInt64)])
    func holdsTheLinkRateUnderHeavyRandomLoss(loss: Double, seed: UInt64) throws {
        let size = 48 << 20
        let rate: UInt64 = 50_000_000
        let (sim, transfer, outcome) = try Self.run(seed: seed, loss: loss, size: size, rtt: 40 * ms, rate: rate, queue: 50 * ms)
        TransferTests.check(sim, transfer, size: size)
        #expect(outcome.goodputBytesPerSecond >= 5.0e6, "loss \(loss): goodput \(outcome.goodputBytesPerSecond) B/s")
    }

    /// wan-thin again, 8 MiB: a shallow queue's drops are not random loss. Start-up's overshoot
    /// loses more than 2 % at once there; had that lowered the in-flight cap's floor as heavy
    /// random loss does, BBR v2 would stop answering the queue's drops: 16 % of the packets
    /// dropped instead of 7 % (10.5 % in about one run in fifteen: ngtcp2's own random choices
    /// are not the simulation's seed). At most one in eight, and the link's rate.
    @Test func keepsAnsweringAShallowQueuesDrops() throws {
        let size = 8 << 20
        let rate: UInt64 = 10_000_000
        let (sim, transfer, outcome) = try Self.run(seed: 2, loss: 0, size: size, rtt: 80 * ms, rate: rate, queue: 10 * ms)
        TransferTests.check(sim, transfer, size: size)
        Self.expectDropped(outcome, sim, atMostOneIn: 8)
        #expect(outcome.goodputBytesPerSecond >= 1.0e6, "goodput \(outcome.goodputBytesPerSecond) B/s")
    }
}
