import FoundationEssentials
import LinuxSystem
import QUICEngine
@_spi(Stacks) import QXferCore
import QXferIdentity

#if canImport(Glibc)
import Glibc
#endif

/// Where a QUIC listener records the ClientHellos whose early data (0-RTT) it took, so that
/// each is taken once by every listener of the same identity: in this process, in another
/// `qxfer recv` of the same configuration folder, or in the next one (RFC 8446 §8.2).
///
/// One empty file per ClientHello in `early-data` in the configuration folder (0700), named
/// by its PSK binder in hex and made with `O_CREAT|O_EXCL`: the file system says atomically,
/// across processes, whether another listener took the same ClientHello first. GnuTLS takes
/// a ClientHello's early data only within its replay window of the ticket's age
/// (`QUICSessionTicketIssuer.replayWindow`) and names the moment a copy can no longer be
/// taken; the entry's modification time is set to that moment, and an entry past it can go.
/// An entry that cannot be made (a full disk, a read-only folder) refuses that early data; the
/// handshake then goes on without it.
/// Nothing is synced: a replay has to arrive within the window, and a machine that lost its
/// page cache has restarted its receivers, whose replay filters refuse tickets issued before
/// they started.
public struct EarlyDataRegister: Sendable, Hashable, QUICEarlyDataRegister {
    /// The folder of entries.
    public let path: String
    /// Entries of a ClientHello longer than this are refused (a binder is at most 64 bytes).
    static let maximumKeyLength = 64

    /// The register in `directory`'s `early-data` folder.
    public init(in directory: ConfigDirectory = .standard) {
        path = directory.file("early-data")
    }

    /// Records `key` (a PSK binder) until `expiry` (seconds since 1970); false if another
    /// listener took it already, or it cannot be recorded.
    public func record(_ key: [UInt8], until expiry: Int64) -> Bool {
        guard !key.isEmpty, key.count <= Self.maximumKeyLength else { return false }
        if mkdir(path, 0o700) != 0 && errno != EEXIST { return false }
        let name = Fingerprint.hex(key)
        let descriptor = open(path + "/" + name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { return false }
        let moment = timespec(tv_sec: time_t(clamping: expiry), tv_nsec: 0)
        var times = [moment, moment]  // access and modification
        futimens(descriptor, &times)
        close(descriptor)
        prune(keeping: name)
        return true
    }

    /// Removes entries past their moment, at most once a minute per folder and process, on a
    /// thread of its own: the folder holds one name per early ClientHello of the last replay
    /// window (six hours), thousands for a busy receiver, and the caller is an event loop.
    private func prune(keeping name: String) {
        let now = time(nil)
        guard Self.lastPrune.withLock({ last in
            if let previous = last[path], now - previous < 60 { return false }
            last[path] = now
            return true
        }) else { return }
        // A second's margin: an entry another listener has just made carries its creation
        // time until it sets its moment.
        DetachedThread.run { [path] in Self.removeEntries(in: path, before: now - 1, keeping: name) }
    }

    private static func removeEntries(in path: String, before cutoff: time_t, keeping name: String) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: path) else { return }
        for entry in names where entry != name {
            var info = stat()
            let file = path + "/" + entry
            if lstat(file, &info) == 0 && info.st_mtim.tv_sec < cutoff { unlink(file) }
        }
    }

    private static let lastPrune = Locked<[String: time_t]>([:])

    /// Lets the next record prune at once (tests).
    static func forgetPruneTimes() { lastPrune.withLock { $0 = [:] } }
}
