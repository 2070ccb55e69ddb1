/// Offer side: the flows of one service (docs/PROTOCOL.md §9.5), one per local QUIC socket
/// (source address) that sent to the agent's port, numbered 0–65535. Bounded; a flow quiet for
/// ``idleTimeout`` is forgotten. Free of I/O: `now` is an input.
struct OfferFlows<Address: Hashable> {
    static var defaultCapacity: Int { 1024 }
    static var defaultIdleTimeout: Duration { .seconds(60) }

    private struct Entry {
        var address: Address
        var lastActive: Duration
    }

    let capacity: Int
    let idleTimeout: Duration
    private var flowByAddress: [Address: UInt16] = [:]
    private var entries: [UInt16: Entry] = [:]
    private var nextFlow: UInt16 = 0

    init(capacity: Int = defaultCapacity, idleTimeout: Duration = defaultIdleTimeout) {
        // Below 65 536, so a free number always exists.
        self.capacity = max(1, min(capacity, 0xFFFF))
        self.idleTimeout = idleTimeout
    }

    var count: Int { entries.count }

    /// The flow of `address`, numbered now if new; nil when the table is full.
    mutating func flow(for address: Address, now: Duration) -> UInt16? {
        if let flow = flowByAddress[address] {
            entries[flow]?.lastActive = now
            return flow
        }
        guard entries.count < capacity else { return nil }
        // Numbers go round before one is used again: a late datagram of a forgotten flow does
        // not reach a new one.
        var flow = nextFlow
        while entries[flow] != nil { flow &+= 1 }
        nextFlow = flow &+ 1
        entries[flow] = Entry(address: address, lastActive: now)
        flowByAddress[address] = flow
        return flow
    }

    /// The local address of `flow`, if it is known.
    mutating func address(of flow: UInt16, now: Duration) -> Address? {
        guard let index = entries.index(forKey: flow) else { return nil }
        entries.values[index].lastActive = now
        return entries.values[index].address
    }

    /// Forgets the flows quiet for ``idleTimeout``; returns their numbers.
    mutating func expire(now: Duration) -> [UInt16] {
        let idle = entries.filter { now - $0.value.lastActive >= idleTimeout }
        for (flow, entry) in idle {
            entries[flow] = nil
            flowByAddress[entry.address] = nil
        }
        return Array(idle.keys)
    }
}

/// A flow of one service: the key of the answer side's ``FlowTable``.
struct FlowKey: Hashable, Sendable {
    var service: UInt8
    var flow: UInt16
}

/// Answer side: what each (service, flow) is carried by (its UDP socket toward the service).
/// Bounded: a new flow past ``capacity`` is refused; one quiet for ``idleTimeout`` is forgotten
/// (the agent closes its socket). Free of I/O: `now` is an input.
struct FlowTable<Value> {
    static var defaultCapacity: Int { 256 }
    static var defaultIdleTimeout: Duration { .seconds(60) }

    private struct Entry {
        var value: Value
        var lastActive: Duration
    }

    let capacity: Int
    let idleTimeout: Duration
    private var entries: [FlowKey: Entry] = [:]

    init(capacity: Int = defaultCapacity, idleTimeout: Duration = defaultIdleTimeout) {
        self.capacity = max(1, capacity)
        self.idleTimeout = idleTimeout
    }

    var count: Int { entries.count }
    var values: [Value] { entries.values.map(\.value) }

    /// The value of `key`, marked active at `now`.
    mutating func value(for key: FlowKey, now: Duration) -> Value? {
        guard let index = entries.index(forKey: key) else { return nil }
        entries.values[index].lastActive = now
        return entries.values[index].value
    }

    /// Marks `key` active at `now`.
    mutating func touch(_ key: FlowKey, now: Duration) {
        guard let index = entries.index(forKey: key) else { return }
        entries.values[index].lastActive = now
    }

    /// Adds `value` for a new `key`; false (nothing added) when the table is full or has the key.
    mutating func insert(_ value: Value, for key: FlowKey, now: Duration) -> Bool {
        guard entries.count < capacity, entries[key] == nil else { return false }
        entries[key] = Entry(value: value, lastActive: now)
        return true
    }

    /// Removes `key`; returns its value.
    mutating func remove(_ key: FlowKey) -> Value? {
        entries.removeValue(forKey: key)?.value
    }

    /// Removes the flows quiet for ``idleTimeout``; returns their values.
    mutating func expire(now: Duration) -> [Value] {
        let idle = entries.filter { now - $0.value.lastActive >= idleTimeout }
        for key in idle.keys { entries[key] = nil }
        return idle.values.map(\.value)
    }

    /// Removes everything; returns the values.
    mutating func removeAll() -> [Value] {
        defer { entries = [:] }
        return entries.values.map(\.value)
    }
}
