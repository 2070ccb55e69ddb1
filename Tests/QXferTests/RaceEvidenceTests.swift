import Foundation
import Testing
import NIOCore
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferRace

/// What the per-host stack memory learns from a race TCP+TLS won (issue 62 §6): "use TCP+TLS"
/// only when QUIC was refused or stayed silent, never when it merely lost a close race. Stacks
/// here are stand-ins whose answers and timings the test sets, so no load can change the story.
@Suite("Racing: what the stack memory learns")
struct RaceEvidenceTests {
    /// How a stand-in stack's attempt goes.
    enum Script: Sendable {
        /// Answers after `answer` (nil: never), then completes after `complete` (nil: never).
        case attempt(answer: Duration?, complete: Duration?)
        /// Fails with "connection refused" after the delay.
        case refused(after: Duration)
    }

    struct StandIn: TransportStack {
        let name: String
        let script: Script
        var hasIndependentStreams: Bool { false }

        func connect<Stack>(
            to endpoint: Endpoint, parameters: NetworkParameters<Stack>, timeout: Duration, peerAnswered: @escaping @Sendable () -> Void
        ) async throws -> any ByteStreamTransport {
            switch script {
            case .refused(let delay):
                try await Task.sleep(for: delay)
                throw QXferError(.connectFailed, "cannot connect to \(endpoint) over UDP: \(String(cString: strerror(ECONNREFUSED)))")
            case .attempt(let answer, let complete):
                let started = ContinuousClock.now
                if let answer {
                    try await Task.sleep(for: answer)
                    peerAnswered()
                }
                guard let complete else {
                    try await Task.sleep(for: .seconds(60))
                    throw QXferError(.connectFailed, "timed out")
                }
                try await Task.sleep(until: started + complete, clock: .continuous)
                return Idle()
            }
        }

        func bind<Stack>(_ request: ListenRequest<Stack>) async throws -> any BoundTransportListener {
            throw QXferError(.bindFailed, "a stand-in does not listen")
        }

        func describe(_ error: any Error, during what: String) -> QXferError {
            (error as? QXferError) ?? (error is CancellationError ? QXferError(.cancelled, "cancelled") : QXferError(.connectionClosed, "\(error)"))
        }
    }

    /// A transport that carries nothing: the race only hands it over.
    struct Idle: ByteStreamTransport {
        var peer: PeerIdentity { PeerIdentity(fingerprint: nil, trust: .unauthenticated, applicationProtocol: "qxfer/1") }
        func write(_ buffer: ByteBuffer) async throws {}
        func read() async throws -> [ByteBuffer]? { nil }
        func read(atLeast minimum: Int) async throws -> [ByteBuffer]? { nil }
        func finish() async throws {}
        func reset(errorCode: UInt64) {}
        func close() {}
        var multiplexer: (any StreamMultiplexer)? { nil }
        func metrics() async -> ConnectionMetrics { ConnectionMetrics() }
    }

    static let endpoint = Endpoint.hostPort(host: "198.51.100.7", port: 7447)

    /// Races QUIC (scripted) against a TCP+TLS that completes after 60 ms, 20 ms apart; returns
    /// the memory's entry for the host once `settle` has passed (the watch past the race), or
    /// as soon as one appears when `expectingEntry` (up to 30 s: a loaded machine may run the
    /// watch late, and a late entry is still the right one).
    static func entryAfterRace(quic: Script, settle: Duration, expectingEntry: Bool = false) async throws -> StackMemory.Entry? {
        let scratch = TemporaryDirectory()
        let memory = StackMemory(path: scratch.file("stacks"))
        var race = RaceStack(
            candidates: [StandIn(name: "QUIC", script: quic), StandIn(name: "TCP+TLS", script: .attempt(answer: .milliseconds(30), complete: .milliseconds(60)))],
            attemptDelay: .milliseconds(20), refusalGrace: .seconds(5), memory: memory)
        race.silenceProof = .milliseconds(600)
        let parameters = NetworkParameters.parameters { TLV { FirstOf { TLS() } } }
        let transport = try await race.connect(to: endpoint, parameters: parameters, timeout: .seconds(10), peerAnswered: {})
        #expect(transport.carryingStack?.name == "TCP+TLS")
        try await Task.sleep(for: settle)
        if expectingEntry {
            _ = await eventually(timeout: .seconds(30)) { memory.entry(for: endpoint) != nil }
        }
        return memory.entry(for: endpoint)
    }

    @Test("QUIC answered but lost a close race (a loaded machine): nothing is remembered")
    func closeRaceIsNotBlockedUDP() async throws {
        // QUIC completes long after TCP+TLS (60 ms), however late a loaded machine runs either.
        let entry = try await Self.entryAfterRace(quic: .attempt(answer: .milliseconds(10), complete: .seconds(60)), settle: .milliseconds(900))
        #expect(entry == nil, "a lost race was remembered as blocked UDP: \(String(describing: entry))")
    }

    @Test("QUIC silent at the win but answering within the proof window: nothing is remembered")
    func lateAnswerIsNotBlockedUDP() async throws {
        let entry = try await Self.entryAfterRace(quic: .attempt(answer: .milliseconds(300), complete: nil), settle: .milliseconds(900))
        #expect(entry == nil, "a slow answer was remembered as blocked UDP: \(String(describing: entry))")
    }

    @Test("QUIC silent through the proof window (UDP dropped): TCP+TLS is remembered")
    func silenceIsBlockedUDP() async throws {
        let entry = try await Self.entryAfterRace(quic: .attempt(answer: nil, complete: nil), settle: .milliseconds(1200), expectingEntry: true)
        #expect(entry?.stack == "TCP+TLS")
    }

    @Test("QUIC refused (ICMP unreachable) while TCP+TLS worked: TCP+TLS is remembered at once")
    func refusalIsBlockedUDP() async throws {
        let entry = try await Self.entryAfterRace(quic: .refused(after: .milliseconds(5)), settle: .milliseconds(100), expectingEntry: true)
        #expect(entry?.stack == "TCP+TLS")
    }
}
