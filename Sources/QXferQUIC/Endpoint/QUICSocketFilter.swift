import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// A classic BPF program on a listening QUIC socket (`SO_ATTACH_FILTER`): the kernel drops
/// datagrams that cannot be QUIC for this listener before it queues them, so a flood of random
/// datagrams neither crowds real packets out of the socket's receive buffer nor costs the event
/// loop a read, an envelope and a header parse each (measured: docs/SECURITY.md, "Floods").
///
/// It keeps a datagram whose first packet is
/// - a long header of a version the engine speaks (Initial, 0-RTT, Handshake);
/// - a long header of another version, of at least 1200 bytes (answered with Version Negotiation);
/// - a short header long enough for a connection ID that begins with the listener's
///   connection-ID prefix (``QUICConfiguration/connectionIDPrefix``): only IDs this listener
///   issued can reach it. (Not the fixed bit: ngtcp2 advertises `grease_quic_bit`, RFC 9287,
///   and peers clear it.)
///
/// ``QUICSocketHandler`` reaches the same verdict on everything the filter drops, so a kernel
/// that refuses the filter changes the cost of a flood, not the answers.
enum QUICSocketFilter {
    /// One `struct sock_filter` (linux/filter.h), field for field.
    struct Instruction: Equatable {
        var code: UInt16
        var jumpIfTrue: UInt8
        var jumpIfFalse: UInt8
        var k: UInt32
    }

    /// `struct sock_fprog`: the count, then (aligned) the address of the first instruction.
    private struct Program: Sendable {
        var count: UInt16
        var instructions: UInt
    }

    static let loadByte: UInt16 = 0x30  // BPF_LD | BPF_B | BPF_ABS
    static let loadWord: UInt16 = 0x20  // BPF_LD | BPF_W | BPF_ABS
    static let loadLength: UInt16 = 0x80  // BPF_LD | BPF_W | BPF_LEN
    static let jumpIfEqual: UInt16 = 0x15  // BPF_JMP | BPF_JEQ | BPF_K
    static let jumpIfAtLeast: UInt16 = 0x35  // BPF_JMP | BPF_JGE | BPF_K
    static let jumpIfAnyBit: UInt16 = 0x45  // BPF_JMP | BPF_JSET | BPF_K
    static let returnValue: UInt16 = 0x06  // BPF_RET | BPF_K
    /// A UDP socket's filter sees the UDP header first: the payload starts 8 bytes in, and the
    /// length it loads includes those 8.
    static let payloadOffset: UInt32 = 8

    /// The program for a listener issuing `connectionIDLength`-byte IDs that begin with `prefix`.
    static func program(connectionIDLength: Int, prefix: [UInt8], versions: [UInt32]) -> [Instruction] {
        enum Target { case next, long, keep, drop }
        var steps: [(code: UInt16, k: UInt32, ifTrue: Target, ifFalse: Target)] = []
        steps.append((loadByte, payloadOffset, .next, .next))
        steps.append((jumpIfAnyBit, 0x80, .long, .next))
        // Short header.
        steps.append((loadLength, 0, .next, .next))
        steps.append((jumpIfAtLeast, payloadOffset + 1 + UInt32(connectionIDLength), .next, .drop))
        for (index, byte) in prefix.enumerated() {
            steps.append((loadByte, payloadOffset + 1 + UInt32(index), .next, .next))
            steps.append((jumpIfEqual, UInt32(byte), .next, .drop))
        }
        steps.append((returnValue, UInt32.max, .next, .next))
        let long = steps.count
        steps.append((loadWord, payloadOffset + 1, .next, .next))
        for version in versions { steps.append((jumpIfEqual, version, .keep, .next)) }
        steps.append((loadLength, 0, .next, .next))
        steps.append((jumpIfAtLeast, payloadOffset + 1200, .keep, .drop))
        let keep = steps.count
        steps.append((returnValue, UInt32.max, .next, .next))
        steps.append((returnValue, 0, .next, .next))
        return steps.enumerated().map { index, step in
            func offset(_ target: Target) -> UInt8 {
                switch target {
                case .next: return 0
                case .long: return UInt8(long - index - 1)
                case .keep: return UInt8(keep - index - 1)
                case .drop: return UInt8(keep + 1 - index - 1)
                }
            }
            return Instruction(code: step.code, jumpIfTrue: offset(step.ifTrue), jumpIfFalse: offset(step.ifFalse), k: step.k)
        }
    }

    /// Attaches `program` to `channel`'s socket. Call it on the channel's event loop: there the
    /// option is set before this returns, while the instructions are still alive. The future
    /// carries what setsockopt reported.
    @discardableResult
    static func attach(_ program: [Instruction], to channel: any Channel) -> EventLoopFuture<Void> {
        precondition(channel.eventLoop.inEventLoop, "the program must outlive the setsockopt call")
        guard let provider = channel as? any SocketOptionProvider else { return channel.eventLoop.makeSucceededVoidFuture() }
        return program.withUnsafeBufferPointer { instructions in
            let value = Program(count: UInt16(instructions.count), instructions: UInt(bitPattern: instructions.baseAddress))
            return provider.unsafeSetSocketOption(level: SocketOptionLevel(SOL_SOCKET), name: SO_ATTACH_FILTER, value: value)
        }
    }
}
