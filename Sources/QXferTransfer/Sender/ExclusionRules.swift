#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What `send --exclude PATTERN` leaves out of a ``SourceTree``, with rsync's meaning for the
/// common cases: a pattern without a slash matches a name at any depth; a trailing slash
/// matches folders only; a leading slash anchors the pattern at the top of the sent tree (the
/// names given on the command line, as the receiver names them); any other slash matches the
/// end of a path, whole components at a time. `*`, `?` and `[...]` are `fnmatch(3)`'s, and `*`
/// stops at a slash unless the pattern holds `**`.
public struct ExclusionRules: Sendable {
    struct Rule: Sendable {
        let pattern: String
        /// A trailing slash: folders only.
        let foldersOnly: Bool
        /// A leading slash: matched against the whole path from the top of the tree.
        let anchored: Bool
        /// A slash inside (or `**`): matched against paths, not a single name.
        let matchesPaths: Bool
        /// `**` in it: `*` crosses slashes too.
        let crossesSlashes: Bool
    }
    let rules: [Rule]

    /// No exclusions.
    public static let none = ExclusionRules(rules: [])

    private init(rules: [Rule]) { self.rules = rules }

    /// Rules for `patterns`, in any order (any one excluding is enough); an empty pattern, or one
    /// that is only slashes, is refused.
    public init(_ patterns: [String]) throws(TransferError) {
        var rules: [Rule] = []
        for original in patterns {
            var pattern = Substring(original)
            let foldersOnly = pattern.hasSuffix("/")
            while pattern.hasSuffix("/") { pattern = pattern.dropLast() }
            let anchored = pattern.hasPrefix("/")
            while pattern.hasPrefix("/") { pattern = pattern.dropFirst() }
            guard !pattern.isEmpty else {
                throw TransferError(.unsupported, "--exclude '\(original)' matches nothing: give a name or pattern, such as '*.tmp' or 'build/'")
            }
            let crossesSlashes = pattern.contains("**")
            rules.append(Rule(
                pattern: String(pattern), foldersOnly: foldersOnly, anchored: anchored,
                matchesPaths: anchored || pattern.contains("/") || crossesSlashes, crossesSlashes: crossesSlashes))
        }
        self.rules = rules
    }

    /// Whether there are no rules.
    public var isEmpty: Bool { rules.isEmpty }

    /// Whether the entry at `path` (its components from the top of the sent tree) is excluded.
    /// `isFolder` nil: not known yet, so only the rules that do not ask for folders decide.
    public func excludes(_ path: [String], isFolder: Bool?) -> Bool {
        guard let name = path.last else { return false }
        for rule in rules {
            if rule.foldersOnly {
                guard isFolder == true else { continue }
            }
            if !rule.matchesPaths {
                if Self.matches(rule.pattern, name, crossingSlashes: false) { return true }
                continue
            }
            if rule.anchored {
                if Self.matches(rule.pattern, path.joined(separator: "/"), crossingSlashes: rule.crossesSlashes) { return true }
                continue
            }
            // The end of the path, whole components: "b/c" matches "a/b/c", not "a/xb/c".
            for start in path.indices where Self.matches(rule.pattern, path[start...].joined(separator: "/"), crossingSlashes: rule.crossesSlashes) {
                return true
            }
        }
        return false
    }

    /// `fnmatch(3)`: with `FNM_PATHNAME` unless `*` may cross slashes. The corresponding C
    /// function is `fnmatch`.
    static func matches(_ pattern: String, _ text: String, crossingSlashes: Bool) -> Bool {
        fnmatch(pattern, text, crossingSlashes ? 0 : FNM_PATHNAME) == 0
    }
}
