import NIOCore
import NIOPosix
@_spi(Stacks) import QXferCore

/// What both stacks share about NIO sockets: one wording for socket errors, the
/// every-address bind, and socket address → ``Endpoint``.
@_spi(Stacks) public enum ChannelErrors {
    /// A connection that failed during `what` for a socket-level reason.
    @_spi(Stacks) public static func lost(_ error: any Error, during what: String) -> QXferError {
        if let error = error as? QXferError { return error }
        return QXferError(.connectionClosed, "\(what) was lost: \(reason(error))", underlying: error)
    }

    /// The reason a socket operation failed, as a user reads it ("Connection refused", "timed out").
    @_spi(Stacks) public static func reason(_ error: any Error) -> String {
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        if error is SocketAddressError.UnknownHost { return "the name does not resolve" }
        if let connect = error as? NIOConnectionError {
            if let first = connect.connectionErrors.first { return reason(first.error) }
            if connect.dnsAAAAError != nil || connect.dnsAError != nil { return "the name does not resolve" }
            return "no address to connect to"
        }
        if let channel = error as? ChannelError {
            switch channel {
            case .connectTimeout: return "timed out"
            case .ioOnClosedChannel, .alreadyClosed: return "the connection is closed"
            default: return "\(channel)"
            }
        }
        return "\(error)"
    }
}

/// Binds `host`, or with no host every address: IPv6's `::` (which takes IPv4 too), and
/// `0.0.0.0` where the host (or its network namespace) has no IPv6.
@_spi(Stacks) public func bindEveryAddress<Bound>(host: String?, _ bind: (String) async throws -> Bound) async throws -> Bound {
    if let host { return try await bind(host) }
    do {
        return try await bind("::")
    } catch {
        return try await bind("0.0.0.0")
    }
}

extension SocketAddress {
    /// The address as an endpoint (`ip:port`); nil for a Unix domain socket.
    @_spi(Stacks) public var endpoint: Endpoint? {
        guard let ip = ipAddress, let port else { return nil }
        return .hostPort(host: ip, port: UInt16(port))
    }
}

#if canImport(Glibc)
import Glibc
#endif
