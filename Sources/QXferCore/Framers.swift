import FoundationEssentials
import Glibc
import NIOCore
import NIOFoundationEssentialsCompat

/// Type-length-value framing over a byte stream: each message carries a 32-bit type.
///
/// On the wire: type (UInt32, big-endian), length (UInt32, big-endian), then `length` bytes.
/// A length above ``maximumMessageSize`` fails the receive with
/// ``QXferError/Code/messageTooLarge`` before anything is allocated; the connection is left
/// open for the application to tell its peer why, then close.
///
/// ```swift
/// let connection = NetworkConnection(to: peer) { TLV { TLS() } }
/// try await connection.send(payload, type: 7)
/// let (content, metadata) = try await connection.receive()   // metadata.type == 7
/// ```
public struct TLV<Transport: ByteStreamProtocol>: NetworkProtocolStack {
    /// The byte stream the frames travel on.
    public var inner: Transport
    /// The largest message accepted, in bytes (default 16 MiB).
    public var maximumMessageSize: Int
    /// Memory shared with other connections for the bodies being received; nil for none.
    public var allowance: MessageAllowance?

    public init(maximumMessageSize: Int = 16 << 20, allowance: MessageAllowance? = nil, @NetworkStackBuilder _ content: () -> Transport) {
        precondition(maximumMessageSize >= 0 && maximumMessageSize <= Int(UInt32.max))
        self.inner = content()
        self.maximumMessageSize = maximumMessageSize
        self.allowance = allowance
    }

    public var transport: TransportDescription { inner.transport }
}

/// What came with a TLV message.
public struct TLVMetadata: Sendable, Hashable {
    /// The message's type.
    public let type: UInt32
}

/// Codable messages over a byte stream, each encoded as JSON or a property list.
///
/// On the wire: length (UInt32, big-endian), then the encoded message. A length above
/// ``maximumMessageSize`` or a message that does not decode fails the connection.
///
/// ```swift
/// let chat = NetworkConnection(to: peer) { Coder(Chat.self, using: .json) { TLS() } }
/// try await chat.send(.hello(name: "ada"))
/// for try await message in chat.messages { print(message) }
/// ```
public struct Coder<Message: Codable & Sendable, Transport: ByteStreamProtocol>: NetworkProtocolStack {
    /// The byte stream the messages travel on.
    public var inner: Transport
    /// How messages are encoded.
    public var format: CoderFormat
    /// The largest encoded message accepted, in bytes (default 16 MiB).
    public var maximumMessageSize: Int
    /// Memory shared with other connections for the messages being received; nil for none.
    public var allowance: MessageAllowance?

    public init(
        _ type: Message.Type, using format: CoderFormat, maximumMessageSize: Int = 16 << 20,
        allowance: MessageAllowance? = nil, @NetworkStackBuilder _ content: () -> Transport
    ) {
        precondition(maximumMessageSize >= 0 && maximumMessageSize <= Int(UInt32.max))
        self.inner = content()
        self.format = format
        self.maximumMessageSize = maximumMessageSize
        self.allowance = allowance
    }

    public var transport: TransportDescription { inner.transport }
}

// MARK: - Frames on a connection

extension NetworkConnection {
    /// Reads one length-prefixed body whose header is `headerSize` bytes and whose length is
    /// the big-endian UInt32 at `lengthOffset`; nil at a clean end of stream between frames.
    /// With an `allowance`, the body's length is reserved from it before the body is read and
    /// given back when this returns (the caller copies the body out).
    func receiveFrame(headerSize: Int, lengthOffset: Int, limit: Int, allowance: MessageAllowance?) async throws -> (header: ByteBuffer, body: ByteBuffer)? {
        let header: ByteBuffer
        do {
            header = try await receiveBuffer(atLeast: headerSize, atMost: headerSize).0
        } catch let error as QXferError where error.code == .endOfStream {
            return nil
        }
        // A length past the limit: the body is not read, and the caller ends the connection.
        let length = try FrameLength.body(in: header.readableBytesView, at: lengthOffset, limit: limit)
        if length == 0 { return (header, ByteBuffer()) }
        try await allowance?.reserve(length)
        defer { allowance?.release(length) }
        do {
            let body = try await receiveBuffer(atLeast: length, atMost: length).0
            return (header, body)
        } catch let error as QXferError where error.code == .endOfStream {
            throw QXferError(.truncated, "the peer closed the connection in the middle of a message")
        }
    }
}

extension NetworkConnection where Stack: TLVStack {
    /// Sends one TLV message.
    public func send(_ content: some DataProtocol, type: UInt32) async throws {
        let limit = parameters.stack.maximumMessageSize
        guard content.count <= limit else {
            throw QXferError(.invalidUse, "a \(content.count)-byte message exceeds the TLV limit of \(limit) bytes")
        }
        var buffer = ByteBuffer()
        buffer.reserveCapacity(8 + content.count)
        buffer.writeInteger(type, endianness: .big)
        buffer.writeInteger(UInt32(content.count), endianness: .big)
        buffer.writeBytes(content)
        try await sendBuffer(buffer)
    }

    /// Sends one TLV message whose body `writeBody` writes in place: it gets room for `capacity`
    /// bytes in the buffer the transport takes and returns how many it wrote (0 ... capacity).
    /// A large body (a file's chunk read straight into it) is not copied on its way out.
    public func send<Failure: Error>(
        type: UInt32, capacity: Int, writingBody writeBody: (UnsafeMutableRawBufferPointer) throws(Failure) -> Int
    ) async throws {
        let limit = parameters.stack.maximumMessageSize
        guard capacity >= 0, capacity <= limit else {
            throw QXferError(.invalidUse, "a \(capacity)-byte message body is outside the TLV limit of \(limit) bytes")
        }
        var buffer = ByteBuffer()
        buffer.reserveCapacity(8 + capacity)
        buffer.writeInteger(type, endianness: .big)
        buffer.writeInteger(UInt32(0), endianness: .big)  // the length, once known
        var reported = 0
        try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: capacity) { raw in
            reported = try writeBody(UnsafeMutableRawBufferPointer(rebasing: raw.prefix(capacity)))
            return (0...capacity).contains(reported) ? reported : 0
        }
        guard (0...capacity).contains(reported) else {
            throw QXferError(.invalidUse, "a message body of \(reported) bytes written into room for \(capacity)")
        }
        buffer.setInteger(UInt32(reported), at: buffer.readerIndex + 4, endianness: .big)
        try await sendBuffer(buffer)
    }

    /// Receives one TLV message; throws ``QXferError/Code/endOfStream`` once the peer is done.
    public func receive() async throws -> (content: Data, metadata: TLVMetadata) {
        guard let message = try await nextMessage() else { throw QXferError(.endOfStream, "the peer finished sending") }
        return message
    }

    /// The TLV messages as they arrive; ends when the peer finishes between messages.
    public var messages: AsyncThrowingStream<(content: Data, metadata: TLVMetadata), any Error> {
        AsyncThrowingStream(unfolding: { try await self.nextMessage() })
    }

    private func nextMessage() async throws -> (content: Data, metadata: TLVMetadata)? {
        guard let (header, body) = try await receiveFrame(
            headerSize: 8, lengthOffset: 4, limit: parameters.stack.maximumMessageSize, allowance: parameters.stack.allowance) else {
            return nil
        }
        let type = header.getInteger(at: header.readerIndex, endianness: .big, as: UInt32.self)!
        return (Data(buffer: body), TLVMetadata(type: type))
    }
}

extension NetworkConnection where Stack: CoderStack {
    /// Sends one Codable message.
    public func send(_ message: Stack.Message) async throws {
        let encoded = try parameters.stack.format.encode(message)
        let limit = parameters.stack.maximumMessageSize
        guard encoded.count <= limit else {
            throw QXferError(.invalidUse, "an encoded \(encoded.count)-byte message exceeds the limit of \(limit) bytes")
        }
        var buffer = ByteBuffer()
        buffer.reserveCapacity(4 + encoded.count)
        buffer.writeInteger(UInt32(encoded.count), endianness: .big)
        buffer.writeBytes(encoded)
        try await sendBuffer(buffer)
    }

    /// Receives one Codable message; throws ``QXferError/Code/endOfStream`` once the peer is done.
    public func receive() async throws -> Stack.Message {
        guard let message = try await nextMessage() else { throw QXferError(.endOfStream, "the peer finished sending") }
        return message
    }

    /// The Codable messages as they arrive; ends when the peer finishes between messages.
    public var messages: AsyncThrowingStream<Stack.Message, any Error> {
        AsyncThrowingStream(unfolding: { try await self.nextMessage() })
    }

    private func nextMessage() async throws -> Stack.Message? {
        guard let (_, body) = try await receiveFrame(
            headerSize: 4, lengthOffset: 0, limit: parameters.stack.maximumMessageSize, allowance: parameters.stack.allowance) else {
            return nil
        }
        do {
            return try parameters.stack.format.decode(Stack.Message.self, from: Data(buffer: body))
        } catch {
            cancel()
            throw QXferError(.malformedMessage, "the peer sent a message that does not decode as \(Stack.Message.self)", underlying: error)
        }
    }
}

/// A stack whose top layer is ``TLV``, whatever transport is below it.
public protocol TLVStack: NetworkProtocolStack {
    /// The largest message accepted, in bytes.
    var maximumMessageSize: Int { get }
    /// Memory shared with other connections for the bodies being received.
    var allowance: MessageAllowance? { get }
}
extension TLV: TLVStack {}

/// A stack whose top layer is ``Coder``, whatever transport is below it.
public protocol CoderStack: NetworkProtocolStack {
    /// The type of the messages.
    associatedtype Message: Codable & Sendable
    /// How messages are encoded.
    var format: CoderFormat { get }
    /// The largest encoded message accepted, in bytes.
    var maximumMessageSize: Int { get }
    /// Memory shared with other connections for the messages being received.
    var allowance: MessageAllowance? { get }
}
extension Coder: CoderStack {}
