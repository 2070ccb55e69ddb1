import Glibc

/// A string compared and hashed by its UTF-8 bytes, as the kernel compares file names.
///
/// Swift's `String` equality is Unicode canonical equivalence: "café" written with U+00E9 and
/// with "e" and U+0301 are equal strings, yet two files side by side on Linux (a folder that
/// holds names from macOS, which writes the second form, and from Linux, which keeps what it
/// is given). Names and paths are keyed with this type wherever two of them must be told apart.
struct ExactString: Hashable, Sendable {
    let value: String

    init(_ value: String) { self.value = value }

    static func == (a: ExactString, b: ExactString) -> Bool { equalBytes(a.value, b.value) }

    /// Whether `a` and `b` hold the same UTF-8 bytes (one `memcmp`, for paths of kilobytes).
    static func equalBytes(_ a: String, _ b: String) -> Bool {
        guard a.utf8.count == b.utf8.count else { return false }
        var a = a, b = b
        return a.withUTF8 { x in b.withUTF8 { y in x.isEmpty || memcmp(x.baseAddress!, y.baseAddress!, x.count) == 0 } }
    }

    func hash(into hasher: inout Hasher) { ExactString.hash(value, into: &hasher) }

    /// Feeds `string`'s UTF-8 bytes and their count to `hasher`.
    static func hash(_ string: String, into hasher: inout Hasher) {
        var string = string
        string.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
        hasher.combine(string.utf8.count)
    }
}
