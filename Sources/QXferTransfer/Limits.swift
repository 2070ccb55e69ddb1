/// The limits of qxfer/1 (docs/PROTOCOL.md, "Limits"). Every length and count read from the
/// network is checked against these before anything is allocated.
public enum ProtocolLimits {
    /// The largest message body, in bytes (16 MiB, the `TLV` framer's default).
    public static let maximumMessageSize = 16 << 20
    /// The largest body of an Offer or Accept sent in parts (Continuations, docs/PROTOCOL.md
    /// §3.9), in bytes (256 MiB).
    public static let maximumLongMessageSize = 256 << 20
    /// The most frames one Batch may carry (docs/PROTOCOL.md §3.6): the receiver handles a
    /// Batch in one go, so this bounds the work one message of one connection can make it do
    /// before others have their turn (a 16 MiB Batch of one-byte FileData held some 800 000).
    /// The reference sender puts at most 256 files (513 frames) in one; a receiver's verdicts
    /// come in Batches of at most 4096.
    public static let maximumBatchFrames = 4096
    /// The largest FileData payload, in bytes (1 MiB).
    public static let maximumChunkSize = 1 << 20
    /// The longest run of zeros one Zeros message stands for, in bytes (1 GiB: hashing it takes
    /// about a second at worst, docs/PROTOCOL.md §3.8).
    public static let maximumZerosLength: UInt64 = 1 << 30
    /// The largest file an offer may mark early (sent before Accept, docs/PROTOCOL.md §3.7).
    public static let maximumEarlyFileSize: UInt64 = 256 << 10
    /// The most bytes the early files of one offer may add up to.
    public static let maximumEarlyBytes: UInt64 = 4 << 20
    /// The most entries one Offer may carry.
    public static let maximumEntries = 1_000_000
    /// The most components in one relative path.
    public static let maximumDepth = 64
    /// The longest component, in bytes (Linux NAME_MAX).
    public static let maximumNameLength = 255
    /// The longest relative path, in bytes, counting one `/` between components (PATH_MAX - 1).
    public static let maximumPathLength = 4095
    /// The longest symlink target, in bytes.
    public static let maximumLinkTargetLength = 4095
    /// The longest error message, in bytes of UTF-8.
    public static let maximumMessageTextLength = 1024
    /// The longest digest, in bytes.
    public static let maximumDigestLength = 64
}
