/// A relative path received from the network, checked so that it can only name a location
/// under the target directory.
///
/// Rules (docs/PROTOCOL.md, "Paths"): 1 to ``ProtocolLimits/maximumDepth`` components; each
/// component 1 to 255 bytes of UTF-8, not `.` or `..`, without `/`, NUL or ASCII control
/// characters (U+0001–U+001F, U+007F: they only serve to forge terminal output), and not ending
/// in the reserved suffixes `.qxfer-partial` / `.qxfer-journal`; the whole path, joined with
/// `/`, at most ``ProtocolLimits/maximumPathLength`` bytes. A backslash is an ordinary
/// character on Linux; Unicode, spaces and bidirectional marks are accepted as they are valid
/// names (messages print them through ``TransferError``'s one-line filter).
public struct SafePath: Hashable, Sendable, CustomStringConvertible {
    /// The checked components.
    public let components: [String]

    /// Equal when the components are byte for byte, as the kernel compares names (not
    /// canonically equivalent Unicode, which `String` compares: ``ExactString``).
    public static func == (a: SafePath, b: SafePath) -> Bool {
        a.components.elementsEqual(b.components, by: ExactString.equalBytes)
    }

    public func hash(into hasher: inout Hasher) {
        for component in components { ExactString.hash(component, into: &hasher) }
    }

    /// Suffixes reserved for the receiver's own temporary files.
    public static let reservedSuffixes = [".qxfer-partial", ".qxfer-journal"]

    /// Checks received components.
    public init(validating components: [String]) throws(TransferError) {
        guard !components.isEmpty else { throw TransferError(.unsafePath, "empty path") }
        guard components.count <= ProtocolLimits.maximumDepth else {
            throw TransferError(.unsafePath, "path of \(components.count) components is deeper than \(ProtocolLimits.maximumDepth)")
        }
        var total = components.count - 1
        for component in components {
            try SafePath.checkComponent(component, in: components)
            total += component.utf8.count
        }
        guard total <= ProtocolLimits.maximumPathLength else {
            throw TransferError(.unsafePath, "path of \(total) bytes is longer than \(ProtocolLimits.maximumPathLength)")
        }
        self.components = components
    }

    /// Splits a `/`-separated relative path and checks it: a leading `/` (absolute path), a
    /// trailing `/` or `//` (empty component) are all rejected.
    public init(validating string: String) throws(TransferError) {
        // Split at '/' bytes, as the kernel does, not at '/' Characters: a '/' followed by a
        // combining mark is one Character (found by fuzz/harness/FuzzPaths.swift).
        let parts = string.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false)
        try self.init(validating: parts.map { String(decoding: $0, as: UTF8.self) })
    }

    static func checkComponent(_ component: String, in components: [String]) throws(TransferError) {
        // Joined only for a message: a large offer checks millions of components.
        var shown: String { components.joined(separator: "/") }
        guard !component.isEmpty else {
            throw TransferError(.unsafePath, "path '\(shown)' has an empty component (absolute path, '//' or trailing '/')")
        }
        guard component != ".", component != ".." else {
            throw TransferError(.unsafePath, "path '\(shown)' contains '\(component)'")
        }
        let bytes = component.utf8.count
        guard bytes <= ProtocolLimits.maximumNameLength else {
            throw TransferError(.unsafePath, "a name in '\(shown.prefix(64))…' is \(bytes) bytes, longer than NAME_MAX (255)")
        }
        for byte in component.utf8 {
            if byte == UInt8(ascii: "/") { throw TransferError(.unsafePath, "a name in '\(shown)' contains '/'") }
            if byte == 0 { throw TransferError(.unsafePath, "a name in '\(shown)' contains NUL") }
            if byte < 0x20 || byte == 0x7f { throw TransferError(.unsafePath, "a name in '\(shown)' contains a control character") }
        }
        for suffix in reservedSuffixes where component.hasSuffix(suffix) {
            throw TransferError(.unsafePath, "path '\(shown)' uses the reserved suffix \(suffix)")
        }
    }

    /// The path joined with `/`.
    public var description: String { components.joined(separator: "/") }
    /// The last component.
    public var name: String { components[components.count - 1] }
    /// The components of the containing directory (empty for a top-level entry).
    public var parentComponents: ArraySlice<String> { components.dropLast() }

    /// Checks a symlink target for a link at this path: it must stay inside the tree.
    ///
    /// Accepted targets are relative, at most ``ProtocolLimits/maximumLinkTargetLength`` bytes,
    /// without NUL or control characters, with names of at most 255 bytes, and of the form
    /// `../` × k followed by names only (`.` and empty components are ignored), where k is at
    /// most the depth of the link's directory. `..` after a name is rejected even when it
    /// would resolve inside, because the name may itself be a symlink (`d -> .`, `d/..`), and
    /// lexical resolution is then wrong; with `..` only in front, every `..` climbs a real
    /// directory the receiver created, and what follows descends into the tree.
    public func validateLinkTarget(_ target: String) throws(TransferError) {
        let shown = description
        guard !target.isEmpty else { throw TransferError(.unsafePath, "symlink '\(shown)' has an empty target") }
        guard target.utf8.count <= ProtocolLimits.maximumLinkTargetLength else {
            throw TransferError(.unsafePath, "symlink '\(shown)' has a target longer than \(ProtocolLimits.maximumLinkTargetLength) bytes")
        }
        guard target.utf8.first != UInt8(ascii: "/") else {
            throw TransferError(.unsafePath, "symlink '\(shown)' points to an absolute path")
        }
        for byte in target.utf8 where byte < 0x20 || byte == 0x7f {
            throw TransferError(.unsafePath, "symlink '\(shown)' has a control character or NUL in its target")
        }
        var climbs = 0
        var descended = false
        // Components are what lies between '/' bytes, as the kernel resolves them. Splitting
        // Characters instead let "../\u{301}x" pass as one name: a '/' followed by a combining
        // mark is one Character, so a top-level link could climb out (fuzz/harness/FuzzPaths.swift).
        for part in target.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true) {
            if part.elementsEqual(".".utf8) { continue }
            if part.elementsEqual("..".utf8) {
                guard !descended else {
                    throw TransferError(.unsafePath, "symlink '\(shown)' has '..' after a name in its target")
                }
                climbs += 1
                guard climbs <= components.count - 1 else {
                    throw TransferError(.unsafePath, "symlink '\(shown)' points outside the target directory")
                }
                continue
            }
            guard part.count <= ProtocolLimits.maximumNameLength else {
                throw TransferError(.unsafePath, "symlink '\(shown)' has a target name longer than NAME_MAX")
            }
            descended = true
        }
    }
}
