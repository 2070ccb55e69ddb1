import FoundationEssentials
import Glibc
import LinuxSystem
import QXferReach

/// Runs blocking socket work on a thread of its own, off Swift's cooperative pool (two threads
/// on a two-core machine, which the relay's own tasks need too).
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DetachedThread.run { continuation.resume(with: Result { try body() }) }
    }
}

struct RelayTestSocketError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
    static func errno(_ what: String) -> RelayTestSocketError { RelayTestSocketError("\(what): \(String(cString: strerror(Glibc.errno)))") }
}

/// `address:port` for IPv4 as a sockaddr_in.
func relayTestAddress(_ host: String, _ port: UInt16) -> sockaddr_in {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    inet_pton(AF_INET, host, &address.sin_addr)
    return address
}

/// A blocking IPv4 socket for tests: a TCP client of the relay (control connection or splice)
/// or a UDP socket. Used from one thread at a time.
final class RelayTestSocket: @unchecked Sendable {
    let descriptor: Int32
    /// Bytes read past the last message taken.
    private var pending: [UInt8] = []

    private init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    deinit { Glibc.close(descriptor) }

    /// A TCP connection to `port` from `source` (any port).
    static func tcp(to port: UInt16, host: String = "127.0.0.1", from source: String = "127.0.0.1") throws -> RelayTestSocket {
        let socket = RelayTestSocket(descriptor: Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0))
        try socket.bind(source)
        var address = relayTestAddress(host, port)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socket.descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else { throw RelayTestSocketError.errno("connect") }
        return socket
    }

    /// A UDP socket bound to `source`, any port.
    static func udp(from source: String = "127.0.0.1") throws -> RelayTestSocket {
        let socket = RelayTestSocket(descriptor: Glibc.socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0))
        // Room for a test's whole burst while it is still sending (the default holds ~200 KB).
        var size: Int32 = 4 << 20
        setsockopt(socket.descriptor, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        try socket.bind(source)
        return socket
    }

    private func bind(_ source: String) throws {
        var address = relayTestAddress(source, 0)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else { throw RelayTestSocketError.errno("bind \(source)") }
    }

    /// The local port.
    var port: UInt16 {
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        return UInt16(bigEndian: address.sin_port)
    }

    /// Waits until readable; false at the deadline.
    private func readable(within timeout: Duration) -> Bool {
        var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        return poll(&poller, 1, max(milliseconds, 0)) > 0
    }

    // MARK: TCP

    func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard written > 0 else { throw RelayTestSocketError.errno("send") }
            offset += written
        }
    }

    func send(_ message: RelayMessage) throws {
        try write(try message.framed())
    }

    /// Reads what is there, waiting up to `timeout` for something; empty at the end of the stream.
    func read(within timeout: Duration) throws -> [UInt8] {
        if !pending.isEmpty {
            defer { pending = [] }
            return pending
        }
        guard readable(within: timeout) else { throw RelayTestSocketError("nothing to read within \(timeout)") }
        var buffer = [UInt8](repeating: 0, count: 65536)
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        guard count >= 0 else { throw RelayTestSocketError.errno("recv") }
        return Array(buffer[..<count])
    }

    /// The next relay message, decoded from exactly its frame (what follows stays unread).
    func message(within timeout: Duration = .seconds(20)) throws -> RelayMessage {
        let deadline = ContinuousClock.now + timeout
        while true {
            if pending.count >= 4 {
                let length = pending.prefix(4).reduce(0) { $0 << 8 | Int($1) }
                if pending.count >= 4 + length {
                    var decoder = RelayMessageDecoder()
                    let frame = pending.prefix(4 + length)
                    pending.removeFirst(4 + length)
                    guard let message = try decoder.feed(frame).first else { throw RelayTestSocketError("an empty frame") }
                    return message
                }
            }
            let remaining = deadline - .now
            guard remaining > .zero, readable(within: remaining) else { throw RelayTestSocketError("no message within \(timeout)") }
            var buffer = [UInt8](repeating: 0, count: 65536)
            let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { throw RelayTestSocketError("the relay closed the connection") }
            pending += buffer[..<count]
        }
    }

    /// True once the peer has closed (reads return 0), waiting up to `timeout`.
    func closedByPeer(within timeout: Duration = .seconds(20)) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while true {
            let remaining = deadline - .now
            guard remaining > .zero, readable(within: remaining) else { return false }
            var buffer = [UInt8](repeating: 0, count: 65536)
            let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count <= 0 { return true }
        }
    }

    /// Writes what the socket takes now without waiting: the bytes taken, 0 when it is full.
    func writeWithoutWaiting(_ bytes: [UInt8]) throws -> Int {
        let written = bytes.withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        if written < 0 && (Glibc.errno == EAGAIN || Glibc.errno == EWOULDBLOCK) { return 0 }
        guard written >= 0 else { throw RelayTestSocketError.errno("send") }
        return written
    }

    func shutdownWriting() {
        shutdown(descriptor, Int32(SHUT_WR))
    }

    // MARK: UDP

    func send(datagram bytes: [UInt8], to port: UInt16, host: String = "127.0.0.1") {
        var address = relayTestAddress(host, port)
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { target in
                bytes.withUnsafeBytes { sendto(descriptor, $0.baseAddress, $0.count, 0, target, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        }
    }

    /// The next datagram, or nil if none arrives within `timeout`.
    func datagram(within timeout: Duration) -> [UInt8]? {
        guard readable(within: timeout) else { return nil }
        var buffer = [UInt8](repeating: 0, count: 65536)
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        return count >= 0 ? Array(buffer[..<count]) : nil
    }
}
