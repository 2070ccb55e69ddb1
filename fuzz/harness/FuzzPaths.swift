// libFuzzer target: path validation of received names, SafePath(validating:) (both the
// component-array and the string form) and SafePath.validateLinkTarget
// (Sources/QXferTransfer/Paths/SafePath.swift).
//
// Input: bytes split at 0xFF (never valid in UTF-8) into parts; every part but the last is a
// path component (decoded as UTF-8, invalid sequences repaired, as the codec would refuse
// them anyway), the last part is a symlink target. Oracles, beyond "never traps", written
// independently of the code under test from docs/PROTOCOL.md "Paths":
//  - an accepted path has 1…64 components, each 1…255 bytes, none "." or "..", none with '/',
//    NUL or a control character, none ending in a reserved suffix, joined ≤ 4095 bytes;
//  - the string form accepts "a/b/c" exactly when the array form accepts [a, b, c], and
//    yields the same components;
//  - an accepted link target, resolved lexically from the link's directory, never climbs
//    above the target directory, is not absolute, has no NUL or control character, and has
//    no ".." after a name.

func checkAcceptedPath(_ components: [String]) {
    precondition((1...64).contains(components.count), "accepted a path of \(components.count) components")
    var total = components.count - 1
    for c in components {
        let bytes = Array(c.utf8)
        precondition((1...255).contains(bytes.count), "accepted a component of \(bytes.count) bytes")
        precondition(c != "." && c != "..", "accepted '\(c)'")
        precondition(!bytes.contains { $0 == 0x2F || $0 < 0x20 || $0 == 0x7F }, "accepted '/', NUL or a control character")
        precondition(!c.hasSuffix(".qxfer-partial") && !c.hasSuffix(".qxfer-journal"), "accepted a reserved suffix")
        total += bytes.count
    }
    precondition(total <= 4095, "accepted a path of \(total) bytes")
}

func checkAcceptedTarget(_ target: String, linkAt path: SafePath) {
    let bytes = Array(target.utf8)
    precondition(!bytes.isEmpty && bytes.count <= 4095, "accepted a target of \(bytes.count) bytes")
    precondition(bytes.first != 0x2F, "accepted an absolute target")
    precondition(!bytes.contains { $0 < 0x20 || $0 == 0x7F }, "accepted NUL or a control character in a target")
    // Resolved as the kernel does: components are what lies between '/' bytes (not between
    // '/' Characters: a '/' followed by a combining mark is one Character but two components).
    var depth = path.components.count - 1
    var sawName = false
    for part in bytes.split(separator: 0x2F, omittingEmptySubsequences: true) {
        if part.elementsEqual([0x2E]) { continue }
        if part.elementsEqual([0x2E, 0x2E]) {
            precondition(!sawName, "accepted '..' after a name in '\(target)'")
            precondition(depth > 0, "accepted '\(target)' at '\(path)', which climbs out of the target directory")
            depth -= 1
        } else {
            precondition(part.count <= 255, "accepted a target name longer than NAME_MAX")
            sawName = true
            depth += 1
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzPaths(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    guard let data, size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let parts = input.split(separator: 0xFF, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
    let components = Array(parts.dropLast())
    let target = parts.last ?? ""

    let fromArray = try? SafePath(validating: components)
    if let fromArray { checkAcceptedPath(fromArray.components) }
    precondition(fromArray == nil || fromArray!.components == components, "components changed while validating")

    // The string form must agree with the array form whenever the components hold no '/'
    // (with a '/' byte, the string form sees more components than the array form does).
    if !components.contains(where: { $0.utf8.contains(0x2F) }) {
        let fromString = try? SafePath(validating: components.joined(separator: "/"))
        precondition((fromString == nil) == (fromArray == nil) || components.isEmpty,
                      "array and string forms disagree on \(components)")
        if let fromString, let fromArray { precondition(fromString == fromArray, "array and string forms differ") }
    }
    // The string form on its own, on the raw text.
    let whole = String(decoding: input, as: UTF8.self)
    if let path = try? SafePath(validating: whole) {
        checkAcceptedPath(path.components)
        precondition(path.description == whole, "the string form did not keep the text")
    }

    if let fromArray, (try? fromArray.validateLinkTarget(target)) != nil {
        checkAcceptedTarget(target, linkAt: fromArray)
    }
    return 0
}
