#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The resume journal beside a partial file: a few lines of text, rewritten in place at each
/// checkpoint and ending with an XXH3-64 of the lines before it, so a torn write is detected
/// and treated as "no journal".
///
/// ```
/// qxfer-journal 1
/// algorithm xxh3-128
/// size 1048576
/// mtime 1700000000000000000
/// offset 524288
/// prefix 0123456789abcdef0123456789abcdef
/// inode 1234567
/// check 89abcdef01234567
/// ```
///
/// `inode` is the partial's: a journal vouches only for the partial it was written beside.
struct Journal: Equatable {
    var algorithm: DigestAlgorithm
    var size: UInt64
    var modificationTime: Int64
    var offset: UInt64
    var prefixDigest: [UInt8]
    var partialInode: UInt64

    static let maximumSize = 1024

    init(algorithm: DigestAlgorithm, size: UInt64, modificationTime: Int64, offset: UInt64, prefixDigest: [UInt8], partialInode: UInt64 = 0) {
        self.algorithm = algorithm
        self.size = size
        self.modificationTime = modificationTime
        self.offset = offset
        self.prefixDigest = prefixDigest
        self.partialInode = partialInode
    }

    init(target: FileTarget, offset: UInt64, prefixDigest: [UInt8], partialInode: UInt64) {
        self.algorithm = target.algorithm
        self.size = target.size ?? 0
        self.modificationTime = target.modificationTime
        self.offset = offset
        self.prefixDigest = prefixDigest
        self.partialInode = partialInode
    }

    /// Whether the journal was written for this version of the file.
    func matches(_ target: FileTarget) -> Bool {
        algorithm == target.algorithm && size == target.size && modificationTime == target.modificationTime && offset <= size
    }

    var body: String {
        "qxfer-journal 1\nalgorithm \(algorithm.name)\nsize \(size)\nmtime \(modificationTime)\noffset \(offset)\nprefix \(hexString(prefixDigest))\ninode \(partialInode)\n"
    }

    static func check(_ body: String) -> String {
        let hash = XXH3Hasher.hash64(Array(body.utf8))
        return String(hash, radix: 16)
    }

    func write(to journal: Descriptor, shown: String, durable: Bool = true) throws(TransferError) {
        let text = body + "check \(Journal.check(body))\n"
        let bytes = Array(text.utf8)
        let n = bytes.withUnsafeBytes { pwrite(journal.fd, $0.baseAddress, $0.count, 0) }
        guard n == bytes.count else { throw TransferError.posix("cannot write the journal of", "'\(shown)'", errno: n < 0 ? errno : ENOSPC) }
        guard ftruncate(journal.fd, off_t(bytes.count)) == 0, !durable || fdatasync(journal.fd) == 0 else {
            throw TransferError.posix("cannot sync the journal of", "'\(shown)'", errno: errno)
        }
    }

    /// Reads and checks a journal; nil if absent, not the receiver's own
    /// (``TargetDirectory/isOwnPrivateFile(_:)``: another local user's would vouch for what they
    /// planted), too large, damaged or unknown.
    static func read(_ name: String, in parent: Descriptor) -> Journal? {
        guard let file = TargetDirectory.openOwnFile(name, in: parent, flags: O_RDONLY) else { return nil }
        var buffer = [UInt8](repeating: 0, count: maximumSize + 1)
        let n = buffer.withUnsafeMutableBytes { pread(file.fd, $0.baseAddress, $0.count, 0) }
        guard n > 0, n <= maximumSize, let text = String(validating: buffer[0..<n], as: UTF8.self) else { return nil }
        return parse(text)
    }

    static func parse(_ text: String) -> Journal? {
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard lines.last == "" else { return nil }
        lines.removeLast()
        guard let checkLine = lines.popLast(), checkLine.hasPrefix("check ") else { return nil }
        let body = lines.map { $0 + "\n" }.joined()
        guard String(checkLine.dropFirst("check ".count)) == Journal.check(body) else { return nil }
        guard lines.first == "qxfer-journal 1" else { return nil }
        var fields: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let space = line.firstIndex(of: " ") else { return nil }
            fields[String(line[..<space])] = String(line[line.index(after: space)...])
        }
        guard let algorithm = DigestAlgorithm.allCases.first(where: { $0.name == fields["algorithm"] }),
              let size = fields["size"].flatMap({ UInt64($0) }),
              let mtime = fields["mtime"].flatMap({ Int64($0) }),
              let offset = fields["offset"].flatMap({ UInt64($0) }),
              let prefix = fields["prefix"].flatMap(parseHex), prefix.count == (offset == 0 ? 0 : algorithm.digestLength),
              let inode = fields["inode"].flatMap({ UInt64($0) })
        else { return nil }
        return Journal(algorithm: algorithm, size: size, modificationTime: mtime, offset: offset, prefixDigest: prefix, partialInode: inode)
    }
}

/// Parses lower- or upper-case hex; nil on odd length or a non-hex digit.
func parseHex(_ text: String) -> [UInt8]? {
    let digits = Array(text.utf8)
    guard digits.count % 2 == 0 else { return nil }
    func value(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }
    var out: [UInt8] = []
    out.reserveCapacity(digits.count / 2)
    var i = 0
    while i < digits.count {
        guard let hi = value(digits[i]), let lo = value(digits[i + 1]) else { return nil }
        out.append(hi << 4 | lo)
        i += 2
    }
    return out
}
