import FoundationEssentials
import Glibc
import NIOCore
import NIOFoundationEssentialsCompat

/// More streams and unreliable datagrams on one connection: QUIC's extras, honestly degraded
/// on TCP+TLS.
///
/// Each extra stream is itself a `NetworkConnection` of the same stack, so framers work on it
/// unchanged (`Coder` on the connection means `Coder` on each stream). On TCP+TLS each extra
/// stream is a TCP+TLS connection of its own to the same listener, and datagrams travel
/// reliably and in order on one more (docs/PROTOCOL.md §8): applications run unchanged, and
/// the difference shows in the figures. There only the client opens streams, and connection
/// migration is unsupported. `finish()` works on both (on TLS it sends close_notify and
/// half-closes the TCP connection).
extension NetworkConnection {
    /// Opens a new bidirectional stream, waiting while the peer's stream limit is reached.
    /// On TCP+TLS this connects a child connection (clients only; a listener's connection
    /// throws ``QXferError/Code/unsupported``).
    public func openStream() async throws -> NetworkConnection<Stack> {
        let multiplexer = try await requireMultiplexer("streams")
        return NetworkConnection(accepted: try await multiplexer.openStream(), parameters: parameters, remote: endpoint)
    }

    /// The streams the peer opens, in order; ends when the connection closes. On TCP+TLS it
    /// also ends once the client has ended its side of the connection (TLS cannot tell that
    /// from a close), after the streams already admitted.
    public var incomingStreams: AsyncThrowingStream<NetworkConnection<Stack>, any Error> {
        AsyncThrowingStream {
            let multiplexer = try await self.requireMultiplexer("streams")
            guard let stream = try await multiplexer.acceptStream() else { return nil }
            return NetworkConnection(accepted: stream, parameters: self.parameters, remote: self.endpoint)
        }
    }

    /// Ends the sending direction: the peer receives what was sent, then the end of the stream.
    /// Receiving continues to work.
    public func finish() async throws {
        let transport = try await transport()
        try await transport.finish()
    }

    /// Abandons this stream in both directions with an application error code. On the
    /// connection's own stream this closes the connection. On a TCP+TLS extra stream it is an
    /// abortive close (TCP RST): the peer's reads fail, but the code is not transmitted.
    public func reset(errorCode: UInt64 = 0) {
        if let transport = currentTransport() { transport.reset(errorCode: errorCode) }
        cancel()
    }

    /// Moves this connection to a new local socket — a new port, or the local address
    /// `localHost` — as a device does when it changes network (QUIC connection migration).
    /// Transfers carry on; the server validates the new path. QUIC clients only.
    public func migrate(localHost: String? = nil) async throws {
        try await requireMultiplexer("connection migration").migrate(localHost: localHost)
    }

    /// Closes the whole connection, telling the peer why: on QUIC the peer's pending and later
    /// operations fail with a message carrying `errorCode` and `reason`, after what was
    /// already sent has been delivered. TCP+TLS has no place for a code; there this closes
    /// the connection and every extra stream, as ``cancel()`` on the connection does.
    public func close(errorCode: UInt64, reason: String = "") {
        currentTransport()?.multiplexer?.close(errorCode: errorCode, reason: reason)
        cancel()
    }

    /// Closes the whole connection as ``close(errorCode:reason:)`` does, then returns once the
    /// close has left this process, or after `timeout`, when it goes whether or not what was
    /// sent is acknowledged (`.zero`: at once). Call it before a program exits, even after
    /// ``cancel()`` (whose close it then waits for, keeping that close's code): a QUIC
    /// connection lives in the process, and one that exits first takes its close and its last
    /// acknowledgements with it, leaving the peer to its idle timeout. In a cancelled task
    /// (an interrupted program) the close goes at once. On TCP+TLS the kernel delivers the
    /// close; this returns at once.
    public func close(errorCode: UInt64 = 0, reason: String = "", within timeout: Duration) async {
        close(errorCode: errorCode, reason: reason)
        await endedTransport()?.waitUntilCloseSent(within: Task.isCancelled ? .zero : timeout)
    }

    /// Sends one unreliable datagram (QUIC, RFC 9221): delivered at most once, possibly not at
    /// all, never retransmitted. Throws if larger than ``maximumDatagramSize``. On TCP+TLS it is
    /// delivered reliably and in order, waiting while TCP is full; a listener's datagrams sent
    /// before its client's first datagram call are dropped.
    public func sendDatagram(_ content: some DataProtocol) async throws {
        let multiplexer = try await requireMultiplexer("datagrams")
        try await multiplexer.sendDatagram(ByteBuffer(bytes: content))
    }

    /// The datagrams received, as they arrive; ends when the connection closes. A reader that
    /// falls behind loses the oldest ones, as the network would.
    public var datagrams: AsyncThrowingStream<Data, any Error> {
        AsyncThrowingStream {
            let multiplexer = try await self.requireMultiplexer("datagrams")
            return try await multiplexer.receiveDatagram().map { Data(buffer: $0) }
        }
    }

    /// The largest datagram payload the peer and the path accept now; nil if none. On TCP+TLS
    /// a fixed 1200 bytes, what every QUIC path carries.
    public var maximumDatagramSize: Int? {
        get async throws {
            try await requireMultiplexer("datagrams").maximumDatagramSize()
        }
    }

    private func requireMultiplexer(_ what: String) async throws -> any StreamMultiplexer {
        guard let multiplexer = try await transport().multiplexer else {
            throw QXferError(.unsupported, "\(what): not available on this connection")
        }
        return multiplexer
    }
}
