// Linux system interfaces: network namespaces, TUN devices, the monotonic clock, signals.
// Glibc's Swift module does not export the GNU-only calls (ppoll, setns, signalfd), so they
// are looked up once with dlsym; none of them is variadic, so calling through a typed C
// function pointer is exact.
import Glibc

typealias PpollFn = @convention(c) (UnsafeMutablePointer<pollfd>?, nfds_t, UnsafePointer<timespec>?, UnsafePointer<sigset_t>?) -> Int32
typealias SetnsFn = @convention(c) (Int32, Int32) -> Int32
typealias SignalfdFn = @convention(c) (Int32, UnsafePointer<sigset_t>?, Int32) -> Int32

struct SystemError: Error, CustomStringConvertible {
    let description: String
    init(_ message: String) { description = message }
    init(_ what: String, errno code: Int32) { description = "\(what): \(String(cString: strerror(code)))" }
}

enum Sys {
    static let CLONE_NEWNET: Int32 = 0x4000_0000
    static let TUNSETIFF: UInt = 0x4004_54CA
    static let SIOCGIFMTU: UInt = 0x8921
    static let IFF_TUN: Int16 = 0x0001
    static let IFF_NO_PI: Int16 = 0x1000
    static let IFF_VNET_HDR: Int16 = 0x4000
    static let TUNSETOFFLOAD: UInt = 0x4004_54D0
    static let TUN_F_CSUM: Int32 = 0x01
    static let TUN_F_TSO4: Int32 = 0x02
    static let TUN_F_TSO6: Int32 = 0x04
    static let TUN_F_TSO_ECN: Int32 = 0x08
    static let TUN_F_USO4: Int32 = 0x20
    static let TUN_F_USO6: Int32 = 0x40
    /// sizeof(struct virtio_net_hdr): flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
    static let vnetHeaderSize = 10
    static let IFNAMSIZ = 16

    private static func symbol<T>(_ name: String, as type: T.Type) -> T {
        guard let p = dlsym(nil, name) else {
            fatalError("libc lacks \(name)")
        }
        return unsafeBitCast(p, to: T.self)
    }

    nonisolated(unsafe) static let ppoll: PpollFn = symbol("ppoll", as: PpollFn.self)
    nonisolated(unsafe) static let setns: SetnsFn = symbol("setns", as: SetnsFn.self)
    nonisolated(unsafe) static let signalfd: SignalfdFn = symbol("signalfd", as: SignalfdFn.self)

    @inline(__always)
    static func monotonicNs() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) &* 1_000_000_000 &+ Int64(ts.tv_nsec)
    }

    /// Writes text straight to a file descriptor (no stdio buffering, no shared FILE state).
    static func put(_ fd: Int32, _ text: String) {
        var bytes = Array(text.utf8)
        bytes.withUnsafeMutableBytes { buf in
            var off = 0
            while off < buf.count {
                let n = write(fd, buf.baseAddress! + off, buf.count - off)
                if n < 0 { if errno == EINTR { continue }; return }
                off += n
            }
        }
    }

    static func errorText(_ code: Int32 = errno) -> String { String(cString: strerror(code)) }

    /// Asks for 1 ns timer slack (default 50 µs) so release times are honoured precisely.
    static func tightenTimerSlack() {
        let fd = open("/proc/self/timerslack_ns", O_WRONLY | O_CLOEXEC)
        if fd >= 0 {
            _ = "1".withCString { write(fd, $0, 1) }
            close(fd)
        }
    }

    /// A zeroed `struct ifreq` (40 bytes on Linux) with the interface name filled in.
    private static func ifreq(_ name: String) -> [UInt8] {
        var buf = [UInt8](repeating: 0, count: 40)
        for (i, b) in name.utf8.prefix(IFNAMSIZ - 1).enumerated() { buf[i] = b }
        return buf
    }

    /// Path of a network namespace argument: a name under /run/netns, or a path as given.
    static func netnsPath(_ ns: String) -> String {
        ns.contains("/") ? ns : "/run/netns/\(ns)"
    }

    /// Opens the existing TUN device `dev` inside network namespace `ns` ("-" = the current one),
    /// attaches to it with IFF_TUN|IFF_NO_PI (|IFF_VNET_HDR if `vnetHeader`), and returns the
    /// non-blocking fd and the device MTU.
    /// The calling thread returns to its original namespace before this returns.
    static func openTun(ns: String, dev: String, vnetHeader: Bool) throws(SystemError) -> (fd: Int32, mtu: Int) {
        guard !dev.isEmpty, dev.utf8.count < IFNAMSIZ else {
            throw SystemError("invalid device name '\(dev)' (1 to 15 bytes)")
        }
        var original: Int32 = -1
        if ns != "-" {
            original = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC)
            guard original >= 0 else { throw SystemError("cannot open /proc/self/ns/net", errno: errno) }
            let path = netnsPath(ns)
            let target = open(path, O_RDONLY | O_CLOEXEC)
            guard target >= 0 else {
                let e = errno
                close(original)
                throw SystemError("cannot open network namespace \(path)", errno: e)
            }
            let r = setns(target, CLONE_NEWNET)
            let e = errno
            close(target)
            guard r == 0 else {
                close(original)
                throw SystemError("cannot enter network namespace \(path)", errno: e)
            }
        }
        defer {
            if original >= 0 {
                if setns(original, CLONE_NEWNET) != 0 {
                    fatalError("cannot return to the original network namespace: \(errorText())")
                }
                close(original)
            }
        }
        let place = ns == "-" ? "the current network namespace" : "network namespace \(ns)"

        // The device must exist: TUNSETIFF would otherwise create a fresh, unconfigured one.
        let sock = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard sock >= 0 else { throw SystemError("socket", errno: errno) }
        var req = ifreq(dev)
        let mr = req.withUnsafeMutableBytes { ioctl(sock, SIOCGIFMTU, $0.baseAddress!) }
        let me = errno
        close(sock)
        guard mr == 0 else {
            throw SystemError("no device \(dev) in \(place)", errno: me)
        }
        let mtu = req.withUnsafeBytes { Int($0.loadUnaligned(fromByteOffset: 16, as: Int32.self)) }

        let fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw SystemError("cannot open /dev/net/tun", errno: errno) }
        req = ifreq(dev)
        let flags = IFF_TUN | IFF_NO_PI | (vnetHeader ? IFF_VNET_HDR : 0)
        req.withUnsafeMutableBytes { $0.storeBytes(of: flags, toByteOffset: 16, as: Int16.self) }
        let tr = req.withUnsafeMutableBytes { ioctl(fd, TUNSETIFF, $0.baseAddress!) }
        guard tr == 0 else {
            let e = errno
            close(fd)
            let hint = e == EBUSY ? " (another process holds it)" : e == EINVAL ? " (is it a TUN, not a TAP, device?)" : ""
            throw SystemError("cannot attach to TUN device \(dev) in \(place): \(errorText(e))\(hint)")
        }
        return (fd, mtu)
    }

    /// Tells the kernel which offloads the reader of `fd` accepts (TUNSETOFFLOAD): with TSO/USO
    /// the device hands over GSO super-packets, with CSUM alone it segments first but skips the
    /// checksum. Returns the flags that were accepted (USO needs Linux 6.2; retried without it).
    static func setOffload(_ fd: Int32, _ flags: Int32) throws(SystemError) -> Int32 {
        if ioctl(fd, TUNSETOFFLOAD, flags) == 0 { return flags }
        let reduced = flags & ~(TUN_F_USO4 | TUN_F_USO6)
        if errno == EINVAL && reduced != flags && ioctl(fd, TUNSETOFFLOAD, reduced) == 0 { return reduced }
        throw SystemError("TUNSETOFFLOAD", errno: errno)
    }

    /// Blocks `signals` for the process and returns a non-blocking signalfd that reports them.
    static func signalFD(_ signals: [Int32]) throws(SystemError) -> Int32 {
        var mask = sigset_t()
        sigemptyset(&mask)
        for s in signals { sigaddset(&mask, s) }
        guard pthread_sigmask(SIG_BLOCK, &mask, nil) == 0 else { throw SystemError("pthread_sigmask failed") }
        let fd = signalfd(-1, &mask, O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw SystemError("signalfd", errno: errno) }
        return fd
    }
}
