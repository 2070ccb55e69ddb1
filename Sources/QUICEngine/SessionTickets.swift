internal import CNGTCP2

#if canImport(Glibc)
import Glibc
#endif

/// What a client keeps from one connection to resume the next one to the same server
/// (TLS 1.3 session resumption, RFC 8446 §2.2, and 0-RTT, RFC 9001 §4.6).
///
/// Both parts are opaque bytes for the application to store: `tlsSession` is GnuTLS's
/// session data (`gnutls_session_get_data2`: the ticket, the resumption secret and the
/// server's certificate as it was verified), `transportParameters` the server's transport
/// parameters in their wire encoding, which bound what the client may send as early data
/// (RFC 9000 §7.4.1). Both are secrets: whoever holds them can resume as this client.
public struct QUICSessionTicket: Hashable, Sendable {
    /// GnuTLS session data carrying the ticket.
    public var tlsSession: [UInt8]
    /// The server's transport parameters (`ngtcp2_encode_transport_params`, Encrypted Extensions form).
    public var transportParameters: [UInt8]

    /// Upper bound of either part's length accepted back from storage: GnuTLS session data
    /// with one P-256 certificate is about 1.5 KiB, transport parameters about 100 bytes.
    public static let maximumPartLength = 16 << 10

    /// A ticket from stored bytes.
    public init(tlsSession: [UInt8], transportParameters: [UInt8]) {
        self.tlsSession = tlsSession
        self.transportParameters = transportParameters
    }
}

/// Whether a client connection sends early data (0-RTT) and what the server did with it.
public enum QUICEarlyData: Hashable, Sendable {
    /// No ticket was offered, or it carried no usable transport parameters.
    case notAttempted
    /// A ticket was offered; streams opened before the handshake completes travel as 0-RTT.
    case attempted
    /// The server accepted the early data.
    case accepted
    /// The server refused the ticket or the early data; the engine sent it again as 1-RTT.
    case rejected
}

/// Where a server records the ClientHellos whose early data it took, so that each is taken
/// once (RFC 8446 §8.2): shared by every process that holds the same ticket key and kept
/// across their restarts, for as long as GnuTLS could still take a copy (its replay window).
///
/// A server whose issuer has a register hands a resumed client's connection to the
/// application as soon as it took the early data (``QUICSessionTicketIssuer/register``).
public protocol QUICEarlyDataRegister: Sendable {
    /// Records `key` until `expiry` (seconds since 1970); false if it was recorded already,
    /// or cannot be recorded now: the server then refuses that early data.
    func record(_ key: [UInt8], until expiry: Int64) -> Bool
}

/// A server's session-ticket key and 0-RTT replay filter, shared by all its connections.
///
/// Tickets are sealed with a key derived from `secret` (GnuTLS rotates working keys from it
/// over time), so a server that derives the same secret after a restart still accepts the
/// tickets of its previous run. The replay filter (`gnutls_anti_replay`) remembers each
/// ClientHello that carried early data within GnuTLS's time window and refuses early data
/// from a second copy; the handshake then goes on without it (RFC 8446 §8). In memory that
/// holds within one process only; with a ``register`` it holds across processes and restarts.
///
/// `@unchecked Sendable`: the key and the filter are written only in `init` and freed in
/// `deinit`; GnuTLS reads them from any thread; the set of seen ClientHellos is guarded by
/// a pthread mutex (not the standard library's `Mutex`, which ThreadSanitizer cannot see on
/// Linux: docs/SECURITY.md, "Sanitizers").
public final class QUICSessionTicketIssuer: @unchecked Sendable {
    /// ClientHellos remembered at once; beyond this, early data is refused (never memory).
    public static let replayMemoryLimit = 65_536
    /// GnuTLS's replay window: how far a ClientHello's ticket age may stray from the server's
    /// view (and how long each is remembered), and how often at most the filter starts a new
    /// period, refusing early data on tickets issued before it (a period ends at the first
    /// ClientHello that comes a window after it began). A client that sends early data is gone
    /// before its next ticket arrives (the server sends it after the client's Finished), so it
    /// resumes with the same ticket until a new period refuses it, and then gets a new one: with
    /// a window of ten minutes every other send of someone sending less often than that went
    /// without early data (the ticket of the send before had been issued before the current
    /// period). A window as long as a ticket lives (GnuTLS's 6 h) refuses at most one send per
    /// window. Replays are refused by the record of each ClientHello taken, whatever the
    /// window; the window bounds how long that record is kept (at most ``replayMemoryLimit``
    /// in memory, one empty file each in a register).
    public static let replayWindow = Duration.seconds(6 * 3600)

    private let key: UnsafeMutablePointer<UInt8>
    private let keyLength: Int
    let antiReplay: gnutls_anti_replay_t
    private let seenLock: UnsafeMutablePointer<pthread_mutex_t> = {
        let lock = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        lock.initialize(to: pthread_mutex_t())
        pthread_mutex_init(lock, nil)
        return lock
    }()
    private var seen: (entries: [[UInt8]: time_t], oldest: time_t) = ([:], 0)

    /// Where taken early data is recorded beyond this process. With one, early data is
    /// single-use across every server of the same secret and their restarts, so a server hands
    /// a connection whose early data it took to the application at once, before the client's
    /// Finished (0.5-RTT): ``QUICConnection/isHandshakeComplete`` is true from then.
    public let register: (any QUICEarlyDataRegister)?

    /// GnuTLS's ticket master key length (`gnutls_session_ticket_key_generate` makes 64 bytes).
    static let masterKeyLength = 64

    /// Creates an issuer whose ticket key is derived from `secret` (at least 32 bytes), or a
    /// random key when `secret` is nil; `register` records taken early data beyond this process.
    public init(secret: [UInt8]? = nil, register: (any QUICEarlyDataRegister)? = nil) throws(QUICEngineError) {
        self.register = register
        var material = [UInt8](repeating: 0, count: Self.masterKeyLength)
        if let secret {
            guard secret.count >= 32 else {
                throw QUICEngineError(.invalidConfiguration, "a session-ticket secret needs at least 32 bytes")
            }
            // Two HMAC-SHA-256 blocks under distinct labels: one-way, so a ticket key reveals nothing of `secret`.
            for (block, label) in ["qxfer/1 session ticket key 1", "qxfer/1 session ticket key 2"].enumerated() {
                let digest = Self.hmacSHA256(key: secret, message: Array(label.utf8))
                material.replaceSubrange(block * 32..<(block + 1) * 32, with: digest)
            }
        } else {
            QUICRandom.fill(&material)
        }
        key = .allocate(capacity: material.count)
        key.initialize(from: material, count: material.count)
        keyLength = material.count
        var filter: gnutls_anti_replay_t?
        let rv = gnutls_anti_replay_init(&filter)
        guard rv == 0, let filter else {
            key.deallocate()
            throw .gnutls("gnutls_anti_replay_init", rv)
        }
        antiReplay = filter
        gnutls_anti_replay_set_window(filter, UInt32(Self.replayWindow.components.seconds * 1000))
        gnutls_anti_replay_set_add_function(filter, antiReplayAdd)
        gnutls_anti_replay_set_ptr(filter, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit {
        pthread_mutex_destroy(seenLock)
        seenLock.deallocate()
        gnutls_anti_replay_deinit(antiReplay)
        key.update(repeating: 0, count: keyLength)
        key.deallocate()
    }

    /// The key as GnuTLS takes it; valid while the issuer lives.
    var keyDatum: gnutls_datum_t { gnutls_datum_t(data: key, size: UInt32(keyLength)) }

    /// Records a ClientHello's replay key until `expiry`; false if it was seen already or the
    /// memory is full (GnuTLS then refuses that early data).
    func remember(_ entry: [UInt8], until expiry: time_t) -> Bool {
        let now = time(nil)
        pthread_mutex_lock(seenLock)
        defer { pthread_mutex_unlock(seenLock) }
        if seen.entries.count >= Self.replayMemoryLimit || (seen.oldest != 0 && seen.oldest < now) {
            seen.entries = seen.entries.filter { $0.value >= now }
            seen.oldest = seen.entries.values.min() ?? 0
        }
        guard seen.entries[entry] == nil, seen.entries.count < Self.replayMemoryLimit,
              register?.record(Self.clientHelloID(entry), until: Int64(expiry)) ?? true else { return false }
        seen.entries[entry] = expiry
        seen.oldest = seen.oldest == 0 ? expiry : min(seen.oldest, expiry)
        return true
    }

    /// GnuTLS's replay key is its filter's window start (12 bytes) and then the ClientHello's
    /// PSK binder; a register shared by several filters keys on the binder alone.
    static func clientHelloID(_ key: [UInt8]) -> [UInt8] {
        key.count > 12 ? Array(key.dropFirst(12)) : key
    }

    private static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        let rv = key.withUnsafeBytes { k in
            message.withUnsafeBytes { m in
                digest.withUnsafeMutableBytes { d in
                    gnutls_hmac_fast(GNUTLS_MAC_SHA256, k.baseAddress, k.count, m.baseAddress, m.count, d.baseAddress)
                }
            }
        }
        precondition(rv == 0, "gnutls_hmac_fast failed")
        return digest
    }
}

/// GnuTLS's anti-replay store (`gnutls_db_add_func`): 0 stores a new entry, an error refuses early data.
private let antiReplayAdd: @convention(c) (UnsafeMutableRawPointer?, time_t, UnsafePointer<gnutls_datum_t>?,
                                           UnsafePointer<gnutls_datum_t>?) -> Int32 = { pointer, expiry, key, _ in
    guard let pointer, let key, let data = key.pointee.data else { return GNUTLS_E_DB_ERROR }
    let issuer = Unmanaged<QUICSessionTicketIssuer>.fromOpaque(pointer).takeUnretainedValue()
    let entry = Array(UnsafeBufferPointer(start: data, count: Int(key.pointee.size)))
    return issuer.remember(entry, until: expiry) ? 0 : GNUTLS_E_DB_ENTRY_EXISTS
}
