import FoundationEssentials

/// A TCP connection to the relay, as ``RelayRooms`` names it.
public struct RelayConnectionID: Hashable, Sendable, CustomStringConvertible {
    public let value: UInt64
    public init(_ value: UInt64) { self.value = value }
    public var description: String { "#\(value)" }
}

/// What ``RelayRooms`` asks the code around it to do, in order.
public enum RelayAction: Sendable, Equatable {
    /// Write a message on a connection.
    case send(RelayMessage, to: RelayConnectionID)
    /// Close a connection once what was written to it has left.
    case close(RelayConnectionID)
    /// From now on copy bytes both ways between two connections (each was sent `spliced`).
    case splice(RelayConnectionID, RelayConnectionID)
}

/// Whether a new connection may stay.
public enum RelayAdmission: Sendable, Equatable {
    case admitted(RelayConnectionID)
    /// Too many connections: close it, saying why if that is cheap.
    case refused(reason: String)
}

/// What to do with a datagram.
public enum RelayDatagramOutcome: Sendable, Equatable {
    /// Send these bytes back to where it came from (a `bound`).
    case reply([UInt8])
    /// Send the same bytes to this address (a peer's bound seat).
    case forward(to: ClientAddress)
    case drop
}

/// The relay's rooms, seats, splices and limits (docs/PROTOCOL.md §9.2-9.4), free of I/O: the
/// server hands it connections, messages, datagrams and the time, and carries out the actions
/// it returns. Tests and the fuzz harness drive it the same way, on a clock of their own.
///
/// Every table here is bounded by ``RelayLimits``: rooms (globally and per address), seats
/// (two a room), bound datagram addresses (one a seat), splices (per room), connections
/// (globally and per address), allowances (one per address with a seat or a connection).
public struct RelayRooms {
    public typealias Instant = ContinuousClock.Instant

    public let limits: RelayLimits

    private var rooms: [UInt64: Room] = [:]
    private var roomsByName: [String: UInt64] = [:]
    private var seatsByToken: [SeatToken: SeatReference] = [:]
    private var seatsByDatagramAddress: [ClientAddress: SeatReference] = [:]
    private var connections: [RelayConnectionID: Connection] = [:]
    private var perClient: [ClientKey: ClientUse] = [:]
    private var pendingConnections = 0
    private var nextRoom: UInt64 = 0
    private var nextConnection: UInt64 = 0
    private var tokens: TokenSource
    private var counters = RelayStatistics()

    /// - Parameters:
    ///   - limits: the bounds (sanitized: out-of-range figures are clamped).
    ///   - seed: nil draws seat tokens from the system's random source, as a relay must (a
    ///     token is the capability to a seat); a number makes them repeatable, for tests.
    public init(limits: RelayLimits = .default, seed: UInt64? = nil) {
        self.limits = limits.sanitized
        tokens = TokenSource(seed: seed)
    }

    // MARK: Connections

    /// A TCP connection arrived from `address`.
    public mutating func connectionOpened(from address: ClientAddress, now: Instant) -> RelayAdmission {
        let client = address.client
        let use = perClient[client] ?? ClientUse(now: now)
        guard connections.count < limits.maximumConnections, pendingConnections < limits.maximumPendingConnections,
              use.connections < limits.maximumConnectionsPerAddress, use.pendingConnections < limits.maximumPendingConnectionsPerAddress
        else {
            counters.refusals &+= 1
            return .refused(reason: RelayRefusal.tooManyConnections)
        }
        nextConnection &+= 1
        let id = RelayConnectionID(nextConnection)
        connections[id] = Connection(address: address, role: .pending(deadline: now + limits.firstMessageWithin))
        perClient[client, default: use].connections += 1
        perClient[client, default: use].pendingConnections += 1
        pendingConnections += 1
        return .admitted(id)
    }

    /// A message arrived on a connection (already checked by ``RelayMessage/validated()``).
    public mutating func received(_ message: RelayMessage, on id: RelayConnectionID, now: Instant) -> [RelayAction] {
        guard let connection = connections[id], !connection.closing else { return [] }
        switch connection.role {
        case .pending:
            leavePending(id)
            switch message {
            case .hello(let version, let room, let side):
                guard version == RelayMessage.version else { return refuse(id, RelayRefusal.version(version)) }
                switch side {
                case .offer: return offer(room: room, on: id, now: now)
                case .answer: return answer(room: room, on: id, now: now)
                }
            case .splice(let token, let spliceID):
                return splice(token: token, id: spliceID, on: id, now: now)
            default:
                return refuse(id, RelayRefusal.violation("a connection starts with hello or splice"))
            }
        case .control(let seat):
            guard case .signal(let data) = message else {
                return refuse(id, RelayRefusal.violation("a control connection carries only signals after its hello"))
            }
            return signal(data, from: seat, on: id, now: now)
        case .splice, .orphan:
            return refuse(id, RelayRefusal.violation("a splice carries no further message"))
        }
    }

    /// The connection broke the framing or sent something that does not decode: it is refused.
    public mutating func violation(on id: RelayConnectionID, _ what: String) -> [RelayAction] {
        guard let connection = connections[id], !connection.closing else { return [] }
        return refuse(id, RelayRefusal.violation(what))
    }

    /// A connection closed (either way, for any reason).
    public mutating func connectionClosed(_ id: RelayConnectionID, now: Instant) -> [RelayAction] {
        guard let connection = connections.removeValue(forKey: id) else { return [] }
        let client = connection.address.client
        if case .pending = connection.role {
            pendingConnections -= 1
            perClient[client]?.pendingConnections -= 1
        }
        perClient[client]?.connections -= 1
        forgetClientIfIdle(client, now: now)
        switch connection.role {
        case .pending, .orphan:
            return []
        case .control(let reference):
            guard var room = rooms[reference.room] else { return [] }
            room[reference.side]?.control = nil
            guard room.isPaired else {
                // The offer side left before anyone came: the number is free again.
                rooms[reference.room] = room
                return removeRoom(reference.room, saying: nil, now: now)
            }
            // Idle time counts from when the last control connection left.
            room.lastActivity = now
            rooms[reference.room] = room
            guard let peer = room[reference.side.other]?.control else { return [] }
            return [.send(.peerGone, to: peer)]
        case .splice(let roomID, let spliceID, let side):
            guard var room = rooms[roomID], var splice = room.splices[spliceID] else { return [] }
            switch splice {
            case .waiting:
                room.splices[spliceID] = nil
            case .running(let connectionsBySide, var open):
                open[side == .offer ? 0 : 1] = false
                splice = .running(connectionsBySide, open: open)
                room.splices[spliceID] = open == [false, false] ? nil : splice
            }
            rooms[roomID] = room
            return []
        }
    }

    // MARK: Datagrams

    /// A datagram arrived: decoded here (what the server does in two steps, ``bind(token:from:now:)``
    /// and ``forwardingTarget(from:byteCount:now:)``, to keep the data path free of copies).
    public mutating func datagram(_ bytes: ArraySlice<UInt8>, from address: ClientAddress, now: Instant) -> RelayDatagramOutcome {
        switch RelayDatagram(decoding: bytes) {
        case .bind(let token):
            guard bind(token: token, from: address, now: now) else { return .drop }
            return .reply(RelayDatagram.bound(address.datagramAddress).encoded)
        case .data:
            guard let target = forwardingTarget(from: address, byteCount: bytes.count, now: now) else { return .drop }
            return .forward(to: target)
        case .bound, nil:
            dropped()
            return .drop
        }
    }

    /// A `bind` arrived from `address`: true if the token names a seat, which now has that
    /// address (answer with `bound`); false to drop it.
    public mutating func bind(token: some Collection<UInt8>, from address: ClientAddress, now: Instant) -> Bool {
        guard let key = SeatToken(token), let reference = seatsByToken[key], var room = rooms[reference.room],
              var seat = room[reference.side] else {
            dropped()
            return false
        }
        if seat.datagramAddress == address { return true }
        if let old = seat.datagramAddress, seatsByDatagramAddress[old] == reference {
            seatsByDatagramAddress[old] = nil
        }
        // One address, one seat: another seat bound from the same address (its owner's socket
        // moved to another seat) loses it.
        if let other = seatsByDatagramAddress[address], other != reference {
            rooms[other.room]?[other.side]?.datagramAddress = nil
            if other.room == reference.room { room[other.side]?.datagramAddress = nil }
        }
        seat.datagramAddress = address
        room[reference.side] = seat
        rooms[reference.room] = room
        seatsByDatagramAddress[address] = reference
        return true
    }

    /// A `data` datagram of `byteCount` bytes arrived from `address` (or `datagrams` of them
    /// together, a batch the kernel coalesced): where to send it, or nil to drop it (the sender
    /// is no bound seat of a paired room, the peer is not bound, or the sender's allowance is
    /// spent). Counted as relayed when an address is returned.
    public mutating func forwardingTarget(from address: ClientAddress, byteCount: Int, datagrams: Int = 1, now: Instant) -> ClientAddress? {
        guard let reference = seatsByDatagramAddress[address], let room = rooms[reference.room],
              let target = room[reference.side.other]?.datagramAddress,
              charge(address.client, bytes: byteCount, overdrawing: false, now: now) == nil
        else {
            counters.datagramsDropped &+= max(datagrams, 1)
            return nil
        }
        rooms[reference.room]?.lastActivity = now
        counters.datagramsRelayed &+= max(datagrams, 1)
        counters.bytesRelayedOverUDP &+= max(byteCount, 0)
        return target
    }

    /// A datagram the server did not hand over (its send queue was full).
    public mutating func dropped() {
        counters.datagramsDropped &+= 1
    }

    // MARK: Splices

    /// `byteCount` bytes were read from a spliced connection and passed to its partner: counted,
    /// charged to the connection's address. Returns how long to stop reading it when that
    /// address's allowance is spent, nil to read on.
    public mutating func spliceRelayed(_ byteCount: Int, on id: RelayConnectionID, now: Instant) -> Duration? {
        guard let connection = connections[id], case .splice(let roomID, _, _) = connection.role else { return nil }
        counters.bytesRelayedOverTCP &+= max(byteCount, 0)
        rooms[roomID]?.lastActivity = now
        return charge(connection.address.client, bytes: byteCount, overdrawing: true, now: now)
    }

    // MARK: Time

    /// Ends what has waited too long: connections silent since they opened, rooms unpaired
    /// past their wait, paired rooms idle with no control connection, unmatched splices; and
    /// forgets allowances that have refilled. The server calls it about once a second.
    public mutating func tick(now: Instant) -> [RelayAction] {
        var actions: [RelayAction] = []
        for (id, connection) in connections where !connection.closing {
            if case .pending(let deadline) = connection.role, now >= deadline {
                actions += refuse(id, RelayRefusal.silent(limits.firstMessageWithin))
            }
        }
        for (roomID, room) in rooms {
            if !room.isPaired {
                if now >= room.waitDeadline {
                    actions += removeRoom(roomID, saying: RelayRefusal.expired(after: limits.roomWait), now: now)
                }
                continue
            }
            if room.offer?.control == nil, room.answer?.control == nil, now - room.lastActivity >= limits.pairedIdle {
                actions += removeRoom(roomID, saying: nil, now: now)
                continue
            }
            for (spliceID, splice) in room.splices {
                guard case .waiting(_, let connection, let deadline) = splice, now >= deadline else { continue }
                rooms[roomID]?.splices[spliceID] = nil
                connections[connection]?.role = .orphan
                actions += refuse(connection, RelayRefusal.spliceUnmatched(spliceID, limits.spliceWait))
            }
        }
        for (client, use) in perClient where use.isIdle {
            if use.allowanceFull(limits.allowance, now: now) { perClient[client] = nil }
        }
        return actions
    }

    // MARK: What it holds

    /// What the relay has done and holds now (cheap: the server reads it after every batch).
    public var statistics: RelayStatistics {
        var statistics = counters
        statistics.roomsOpen = rooms.count
        statistics.connectionsOpen = connections.count
        return statistics
    }

    /// Every connection the table knows (the server closes them when it stops).
    public var connectionIDs: [RelayConnectionID] { Array(connections.keys) }

    /// Checks that the tables agree with each other and with the limits (tests and the fuzz
    /// harness call it after every step); a description of the first disagreement, or nil.
    public func inconsistency() -> String? {
        if rooms.count > limits.maximumRooms { return "\(rooms.count) rooms over the limit" }
        if roomsByName.count != rooms.count { return "\(roomsByName.count) names for \(rooms.count) rooms" }
        var roomsOfClient: [ClientKey: Int] = [:]
        var seats = 0
        for (roomID, room) in rooms {
            if roomsByName[room.name] != roomID { return "room \(roomID) is not under its name" }
            if room.offer == nil { return "room \(roomID) has no offer seat" }
            if room.splices.count > limits.maximumSplicesPerRoom { return "room \(roomID) has \(room.splices.count) splices" }
            for client in room.clients { roomsOfClient[client, default: 0] += 1 }
            for side in [RoomSide.offer, .answer] {
                guard let seat = room[side] else { continue }
                seats += 1
                let reference = SeatReference(room: roomID, side: side)
                if seatsByToken[seat.token] != reference { return "a seat's token does not lead to it" }
                if let address = seat.datagramAddress, seatsByDatagramAddress[address] != reference {
                    return "a seat's address does not lead to it"
                }
                if seat.signalsSent > limits.maximumSignalsPerSide { return "a seat sent \(seat.signalsSent) signals" }
                if let control = seat.control, connections[control]?.role != .control(reference) {
                    return "a seat's control connection is not its own"
                }
            }
        }
        if seatsByToken.count != seats { return "\(seatsByToken.count) tokens for \(seats) seats" }
        let paired = rooms.values.reduce(0) { $0 + ($1.isPaired ? 1 : 0) }
        if counters.roomsPaired != paired { return "\(counters.roomsPaired) paired rooms counted, \(paired) held" }
        if seatsByDatagramAddress.count > seats { return "more bound addresses than seats" }
        for (client, count) in roomsOfClient {
            if perClient[client]?.rooms != count { return "a client's room count is \(perClient[client]?.rooms ?? 0), not \(count)" }
        }
        for (_, use) in perClient where use.rooms > limits.maximumRoomsPerAddress || use.rooms < 0 {
            return "a client holds \(use.rooms) rooms"
        }
        var connectionsOfClient: [ClientKey: (all: Int, pending: Int)] = [:]
        var pending = 0
        for connection in connections.values {
            let isPending = if case .pending = connection.role { true } else { false }
            connectionsOfClient[connection.address.client, default: (0, 0)].all += 1
            if isPending {
                connectionsOfClient[connection.address.client, default: (0, 0)].pending += 1
                pending += 1
            }
        }
        if pending != pendingConnections { return "\(pendingConnections) pending connections counted, \(pending) held" }
        if connections.count > limits.maximumConnections { return "\(connections.count) connections over the limit" }
        for (client, use) in perClient {
            let held = connectionsOfClient[client] ?? (0, 0)
            if held.all != use.connections || held.pending != use.pendingConnections { return "a client's connection counts disagree" }
        }
        return nil
    }

    // MARK: Hello

    private mutating func offer(room name: String, on id: RelayConnectionID, now: Instant) -> [RelayAction] {
        guard roomsByName[name] == nil else { return refuse(id, RelayRefusal.roomTaken) }
        guard rooms.count < limits.maximumRooms else { return refuse(id, RelayRefusal.full) }
        let address = connections[id]!.address
        guard perClient[address.client, default: ClientUse(now: now)].rooms < limits.maximumRoomsPerAddress else {
            return refuse(id, RelayRefusal.tooManyRooms(limits.maximumRoomsPerAddress))
        }
        nextRoom &+= 1
        let roomID = nextRoom
        let seat = makeSeat(control: id, client: address.client)
        rooms[roomID] = Room(name: name, offer: seat, waitDeadline: now + limits.roomWait, lastActivity: now)
        roomsByName[name] = roomID
        seatsByToken[seat.token] = SeatReference(room: roomID, side: .offer)
        perClient[address.client, default: ClientUse(now: now)].rooms += 1
        connections[id]?.role = .control(SeatReference(room: roomID, side: .offer))
        let wait = Int(limits.roomWait.components.seconds)
        return [.send(.welcome(observed: address.description, bindToken: seat.token.data, expiresIn: wait), to: id)]
    }

    private mutating func answer(room name: String, on id: RelayConnectionID, now: Instant) -> [RelayAction] {
        guard let roomID = roomsByName[name], var room = rooms[roomID], let offer = room.offer else {
            return refuse(id, RelayRefusal.noSuchCode)
        }
        guard room.answer == nil else { return refuse(id, RelayRefusal.codeUsed) }
        let address = connections[id]!.address
        let newClient = address.client != offer.client
        if newClient, perClient[address.client, default: ClientUse(now: now)].rooms >= limits.maximumRoomsPerAddress {
            return refuse(id, RelayRefusal.tooManyRooms(limits.maximumRoomsPerAddress))
        }
        let seat = makeSeat(control: id, client: address.client)
        room.answer = seat
        room.lastActivity = now
        rooms[roomID] = room
        seatsByToken[seat.token] = SeatReference(room: roomID, side: .answer)
        if newClient { perClient[address.client, default: ClientUse(now: now)].rooms += 1 }
        connections[id]?.role = .control(SeatReference(room: roomID, side: .answer))
        counters.pairsServed &+= 1
        counters.roomsPaired += 1
        var actions: [RelayAction] = [
            .send(.welcome(observed: address.description, bindToken: seat.token.data, expiresIn: 0), to: id),
            .send(.paired, to: id),
        ]
        if let offerControl = offer.control { actions.append(.send(.paired, to: offerControl)) }
        return actions
    }

    private mutating func makeSeat(control: RelayConnectionID, client: ClientKey) -> Seat {
        var token = SeatToken(high: tokens.next(), low: tokens.next())
        while seatsByToken[token] != nil { token = SeatToken(high: tokens.next(), low: tokens.next()) }
        return Seat(control: control, client: client, token: token)
    }

    // MARK: Signals

    private mutating func signal(_ data: Data, from reference: SeatReference, on id: RelayConnectionID, now: Instant) -> [RelayAction] {
        guard var room = rooms[reference.room], room.isPaired, var seat = room[reference.side] else {
            return refuse(id, RelayRefusal.violation("a signal before paired"))
        }
        guard seat.signalsSent < limits.maximumSignalsPerSide else {
            return refuse(id, RelayRefusal.tooManySignals(limits.maximumSignalsPerSide))
        }
        seat.signalsSent += 1
        room[reference.side] = seat
        room.lastActivity = now
        rooms[reference.room] = room
        // A peer whose control connection closed misses it: it was told peerGone.
        guard let peer = room[reference.side.other]?.control else { return [] }
        return [.send(.signal(data: data), to: peer)]
    }

    // MARK: Splice

    private mutating func splice(token: Data, id spliceID: Int, on id: RelayConnectionID, now: Instant) -> [RelayAction] {
        guard let key = SeatToken(token), let reference = seatsByToken[key], var room = rooms[reference.room] else {
            return refuse(id, RelayRefusal.noSuchSeat)
        }
        guard room.isPaired else { return refuse(id, RelayRefusal.notPaired) }
        room.lastActivity = now
        switch room.splices[spliceID] {
        case .waiting(let side, let waiting, _) where side != reference.side:
            let bySide = side == .offer ? [waiting, id] : [id, waiting]
            room.splices[spliceID] = .running(bySide, open: [true, true])
            rooms[reference.room] = room
            connections[id]?.role = .splice(room: reference.room, id: spliceID, side: reference.side)
            counters.splicesServed &+= 1
            return [.send(.spliced, to: waiting), .send(.spliced, to: id), .splice(waiting, id)]
        case .waiting, .running:
            return refuse(id, RelayRefusal.spliceInUse(spliceID))
        case nil:
            guard room.splices.count < limits.maximumSplicesPerRoom else {
                return refuse(id, RelayRefusal.tooManySplices(limits.maximumSplicesPerRoom))
            }
            room.splices[spliceID] = .waiting(side: reference.side, connection: id, deadline: now + limits.spliceWait)
            rooms[reference.room] = room
            connections[id]?.role = .splice(room: reference.room, id: spliceID, side: reference.side)
            return []
        }
    }

    // MARK: Helpers

    private mutating func leavePending(_ id: RelayConnectionID) {
        guard let connection = connections[id], case .pending = connection.role else { return }
        connections[id]?.role = .orphan
        pendingConnections -= 1
        perClient[connection.address.client]?.pendingConnections -= 1
    }

    /// Sends `refused` and closes; what the connection held is released when it has closed.
    private mutating func refuse(_ id: RelayConnectionID, _ reason: String) -> [RelayAction] {
        connections[id]?.closing = true
        counters.refusals &+= 1
        return [.send(.refused(reason: reason), to: id), .close(id)]
    }

    /// Removes a room, closing its connections (control ones told `reason` first, if any).
    private mutating func removeRoom(_ roomID: UInt64, saying reason: String?, now: Instant) -> [RelayAction] {
        guard let room = rooms.removeValue(forKey: roomID) else { return [] }
        roomsByName[room.name] = nil
        if room.isPaired { counters.roomsPaired -= 1 }
        var actions: [RelayAction] = []
        for side in [RoomSide.offer, .answer] {
            guard let seat = room[side] else { continue }
            seatsByToken[seat.token] = nil
            if let address = seat.datagramAddress, seatsByDatagramAddress[address] == SeatReference(room: roomID, side: side) {
                seatsByDatagramAddress[address] = nil
            }
            if let control = seat.control {
                connections[control]?.role = .orphan
                if let reason {
                    actions += refuse(control, reason)
                } else {
                    connections[control]?.closing = true
                    actions.append(.close(control))
                }
            }
        }
        for splice in room.splices.values {
            for connection in splice.connections {
                connections[connection]?.role = .orphan
                connections[connection]?.closing = true
                actions.append(.close(connection))
            }
        }
        for client in room.clients {
            perClient[client]?.rooms -= 1
            forgetClientIfIdle(client, now: now)
        }
        return actions
    }

    /// Charges `bytes` to a client's allowance: nil if it had them, else how long until it
    /// has refilled what it overdrew.
    private mutating func charge(_ client: ClientKey, bytes: Int, overdrawing: Bool, now: Instant) -> Duration? {
        guard let allowance = limits.allowance else { return nil }
        var use = perClient[client] ?? ClientUse(now: now)
        let wait = use.spend(bytes, allowance: allowance, overdrawing: overdrawing, now: now)
        perClient[client] = use
        return wait
    }

    /// Forgets a client holding nothing, unless its allowance is still refilling (forgetting
    /// it would hand it a full burst again).
    private mutating func forgetClientIfIdle(_ client: ClientKey, now: Instant) {
        guard let use = perClient[client], use.isIdle, use.allowanceFull(limits.allowance, now: now) else { return }
        perClient[client] = nil
    }
}

// MARK: - The tables' rows

private struct SeatToken: Hashable {
    let high: UInt64
    let low: UInt64

    init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    init?(_ bytes: some Collection<UInt8>) {
        guard bytes.count == RelayMessage.tokenSize else { return nil }
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (index, byte) in bytes.enumerated() {
            if index < 8 { high = high << 8 | UInt64(byte) } else { low = low << 8 | UInt64(byte) }
        }
        self.init(high: high, low: low)
    }

    var data: Data {
        var bytes: [UInt8] = []
        withUnsafeBytes(of: high.bigEndian) { bytes += $0 }
        withUnsafeBytes(of: low.bigEndian) { bytes += $0 }
        return Data(bytes)
    }
}

private struct SeatReference: Hashable {
    let room: UInt64
    let side: RoomSide
}

private struct Seat {
    var control: RelayConnectionID?
    let client: ClientKey
    let token: SeatToken
    var datagramAddress: ClientAddress?
    var signalsSent = 0

    init(control: RelayConnectionID, client: ClientKey, token: SeatToken) {
        self.control = control
        self.client = client
        self.token = token
    }
}

private enum Splice {
    case waiting(side: RoomSide, connection: RelayConnectionID, deadline: ContinuousClock.Instant)
    /// The offer side's connection, then the answer side's; which of them are still open.
    case running([RelayConnectionID], open: [Bool])

    var connections: [RelayConnectionID] {
        switch self {
        case .waiting(_, let connection, _): [connection]
        case .running(let connections, _): connections
        }
    }
}

private struct Room {
    let name: String
    var offer: Seat?
    var answer: Seat?
    let waitDeadline: ContinuousClock.Instant
    var lastActivity: ContinuousClock.Instant
    var splices: [Int: Splice] = [:]

    init(name: String, offer: Seat, waitDeadline: ContinuousClock.Instant, lastActivity: ContinuousClock.Instant) {
        self.name = name
        self.offer = offer
        self.waitDeadline = waitDeadline
        self.lastActivity = lastActivity
    }

    var isPaired: Bool { answer != nil }

    subscript(side: RoomSide) -> Seat? {
        get { side == .offer ? offer : answer }
        set { if side == .offer { offer = newValue } else { answer = newValue } }
    }

    /// The clients the room counts against: one, or two when the sides' addresses differ.
    var clients: [ClientKey] {
        var clients: [ClientKey] = []
        if let offer { clients.append(offer.client) }
        if let answer, answer.client != offer?.client { clients.append(answer.client) }
        return clients
    }
}

private struct Connection {
    enum Role: Equatable {
        /// Its first message has not come.
        case pending(deadline: ContinuousClock.Instant)
        /// A control connection holding a seat.
        case control(SeatReference)
        /// A splice, waiting or running.
        case splice(room: UInt64, id: Int, side: RoomSide)
        /// Refused, or its room is gone: it holds nothing, and is closing.
        case orphan
    }
    let address: ClientAddress
    var role: Role
    /// A `refused` or a close was asked for: later messages are ignored.
    var closing = false
}

/// What one client address holds and has spent.
private struct ClientUse {
    var rooms = 0
    var connections = 0
    var pendingConnections = 0
    /// Bytes left in its allowance at `refilled`.
    var allowanceLeft: Int?
    var refilled: ContinuousClock.Instant

    init(now: ContinuousClock.Instant) {
        refilled = now
    }

    var isIdle: Bool { rooms <= 0 && connections <= 0 }

    /// The allowance at `now`: what was left plus the refill since, at most the burst.
    private func available(_ allowance: RelayAllowance, now: ContinuousClock.Instant) -> Int {
        guard let left = allowanceLeft else { return allowance.burst }
        let elapsed = now - refilled
        guard elapsed > .zero else { return left }
        // Past the time a full refill takes, the bucket is full; under it the product fits a
        // Double exactly enough and far under Int's range (burst and rate are at most 2^50).
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        let refill = min(Double(allowance.bytesPerSecond) * min(seconds, 1e6), Double(allowance.burst))
        return min(left + Int(refill), allowance.burst)
    }

    func allowanceFull(_ allowance: RelayAllowance?, now: ContinuousClock.Instant) -> Bool {
        guard let allowance else { return true }
        return available(allowance, now: now) >= allowance.burst
    }

    /// Spends `bytes` (at most 2^31 a call, what one read or datagram can be). With
    /// `overdrawing` false (a datagram, which is dropped when it does not fit) nothing is spent
    /// unless all of it is there; with `overdrawing` true (a splice's bytes, read already) they
    /// are spent regardless. Nil if the allowance held them, else how long until it is back
    /// above zero.
    mutating func spend(_ bytes: Int, allowance: RelayAllowance, overdrawing: Bool, now: ContinuousClock.Instant) -> Duration? {
        let before = available(allowance, now: now)
        let bytes = min(max(bytes, 0), 1 << 31)
        if before >= bytes {
            allowanceLeft = before - bytes
            refilled = now
            return nil
        }
        if overdrawing {
            // Bounded below, so a spliced peer that keeps being read cannot push it out of range.
            allowanceLeft = max(before - bytes, -(1 << 52))
            refilled = now
        }
        let debt = Double(bytes) - Double(before)
        return .nanoseconds(Int64(min(debt / Double(allowance.bytesPerSecond) * 1e9, 3.6e12)) + 1_000_000)
    }
}

extension RoomSide {
    /// The seat across the room.
    var other: RoomSide { self == .offer ? .answer : .offer }
}

/// Where seat tokens come from: the system's random source, or a seeded generator for tests.
private struct TokenSource {
    private var state: UInt64?

    init(seed: UInt64?) { state = seed }

    mutating func next() -> UInt64 {
        guard var seeded = state else {
            var system = SystemRandomNumberGenerator()
            return system.next()
        }
        // SplitMix64.
        seeded &+= 0x9E37_79B9_7F4A_7C15
        state = seeded
        var z = seeded
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE5_E4B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
