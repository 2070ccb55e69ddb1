import NIOCore
import NIOEmbedded
import Testing
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferTLS

/// How far a listener's connection reads ahead of its reader: up to the floor on its own,
/// further only with a share of the listener's budget or for what its waiting reader needs.
@Suite("TLS read-ahead budget")
struct ReadAheadBudgetTests {
    /// Counts the socket reads the bridge lets through.
    final class ReadCounter: ChannelOutboundHandler {
        typealias OutboundIn = Never
        var reads = 0
        func read(context: ChannelHandlerContext) {
            reads += 1
            context.read()
        }
    }

    /// A bridge of a listener whose budget is `budget`, in a channel with nothing below it.
    func bridge(budget: ReadAheadBudget) throws -> (EmbeddedChannel, InboundBridge, ReadCounter) {
        let channel = EmbeddedChannel()
        let counter = ReadCounter()
        let bridge = InboundBridge(budget: budget)
        try channel.pipeline.syncOperations.addHandler(counter)
        try channel.pipeline.syncOperations.addHandler(bridge)
        bridge.setWakeMarks(on: InMemoryTLSTests.MarkRecorder())
        return (channel, bridge, counter)
    }

    func bytes(_ count: Int) -> ByteBuffer { ByteBuffer(repeating: 7, count: count) }

    @Test("With the budget spent, a connection holds no more than the floor, counting what its reader took ahead of its need")
    func spentBudgetHoldsTheFloor() throws {
        let (channel, bridge, counter) = try bridge(budget: ReadAheadBudget(bytes: 0))
        channel.read()
        #expect(counter.reads == 1)
        try channel.writeInbound(bytes(InboundBridge.floor + 1000))
        channel.read()
        #expect(counter.reads == 1, "read on while holding more than the floor")

        // A framer reads a message's 8-byte header and takes everything queued; what followed the
        // header stays with it, so the bridge reads no further while the message waits.
        let header = try #require(try bridge.next(atLeast: 8, on: channel.eventLoop).wait())
        #expect(header.reduce(0) { $0 + $1.readableBytes } == InboundBridge.floor + 1000)
        #expect(counter.reads == 1, "read on while the reader held more than the floor")

        // The reader comes back for the rest of a long message: it may always read up to its need.
        let body = bridge.next(atLeast: 1 << 20, on: channel.eventLoop)
        #expect(counter.reads == 2)
        try channel.writeInbound(bytes(600 << 10))
        channel.read()
        #expect(counter.reads == 3, "a waiting reader's need was held back")
        try channel.writeInbound(bytes(424 << 10))
        #expect(try body.wait()?.reduce(0) { $0 + $1.readableBytes } == 1 << 20)
        channel.read()
        #expect(counter.reads == 4)  // nothing held: under the floor again
        _ = try? channel.finish()
    }

    @Test("A share of the budget lets one connection read ahead in full, and goes back once it holds less than the floor")
    func shareIsTakenAndGivenBack() throws {
        let budget = ReadAheadBudget(bytes: 3 << 20)
        let (channel, bridge, counter) = try bridge(budget: budget)
        let (otherChannel, _, otherCounter) = try self.bridge(budget: budget)
        try channel.writeInbound(bytes(InboundBridge.floor))
        channel.read()
        #expect(counter.reads == 1)
        #expect(budget.inUse == 2 << 20)

        // The second connection finds too little left: it stops at the floor.
        try otherChannel.writeInbound(bytes(InboundBridge.floor))
        otherChannel.read()
        #expect(otherCounter.reads == 0)

        // The first reads on up to its high watermark, then waits for its reader.
        try channel.writeInbound(bytes((1 << 20) - InboundBridge.floor))
        channel.read()
        #expect(counter.reads == 1)
        let taken = try #require(try bridge.next(atLeast: 1 << 20, on: channel.eventLoop).wait())
        #expect(taken.reduce(0) { $0 + $1.readableBytes } == 1 << 20)
        #expect(budget.inUse == 0, "a bridge holding nothing kept its share")
        otherChannel.read()
        #expect(otherCounter.reads == 1, "the share given back went to nobody")
        #expect(budget.inUse == 2 << 20)
        _ = try? channel.finish()
        _ = try? otherChannel.finish()
        #expect(budget.inUse == 0, "a closed connection kept its share")
    }

    @Test("A reader waiting for more than the floor takes a share at once, and gives it back once it holds less")
    func waitingReaderTakesAShare() throws {
        let budget = ReadAheadBudget(bytes: 8 << 20)
        let (channel, bridge, counter) = try bridge(budget: budget)
        channel.read()
        #expect(budget.inUse == 0, "a share taken before anything was needed")
        let body = bridge.next(atLeast: 1 << 20, on: channel.eventLoop)
        channel.read()
        #expect(counter.reads == 2)
        #expect(budget.inUse == 2 << 20, "a reader waiting for 1 MiB read on without a share")
        try channel.writeInbound(bytes(1 << 20))
        #expect(try body.wait()?.reduce(0) { $0 + $1.readableBytes } == 1 << 20)
        #expect(budget.inUse == 0)
        _ = try? channel.finish()
    }

    @Test("The budget's arithmetic: shares up to its size, refused beyond, free again when given back")
    func budgetArithmetic() {
        let budget = ReadAheadBudget(bytes: 5)
        #expect(budget.reserve(2) && budget.reserve(3))
        #expect(!budget.reserve(1))
        budget.release(3)
        #expect(budget.inUse == 2 && budget.reserve(3))
        #expect(!ReadAheadBudget(bytes: -1).reserve(1))
    }
}
