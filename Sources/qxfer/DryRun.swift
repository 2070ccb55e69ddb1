import PlainText
import QXfer
import QXferTransfer

/// `send --dry-run`: what the send would offer, found by the same scan, and nothing sent.
enum DryRun {
    /// Lists `tree` on standard output: a line per entry (its size, or what it is, then its path
    /// as the receiver would name it), the entries left out (as a send names them), then the
    /// totals; with `json`, an `entry` event per entry, `failed` events, and a `dry_run` event.
    /// Throws what the send would end with for the entries left out (exit 74 or 77), if anything.
    static func show(_ tree: SourceTree, json: Bool) throws {
        var files = 0, folders = 0, links = 0
        for (entry, source) in zip(tree.entries, tree.sources) {
            let path = entry.path.joined(separator: "/")
            let unknown = entry.flags.contains(.sizeUnknown)
            switch entry.kind {
            case .file: files += 1
            case .directory: folders += 1
            case .symlink: links += 1
            }
            if json {
                var fields: [String: Any] = ["path": path, "kind": kindName(entry.kind)]
                if entry.kind == .file { fields["size"] = unknown ? JSONText.null : entry.size }
                if entry.kind == .symlink { fields["target"] = entry.linkTarget }
                if source == .standardInput { fields["standard_input"] = true }
                Console.emit("entry", fields)
                continue
            }
            let size = switch entry.kind {
            case .file: unknown ? "unknown" : TextFormat.bytes(entry.size)
            case .directory: "folder"
            case .symlink: "link"
            }
            let shown = switch entry.kind {
            case .directory: path + "/"
            case .file where source == .standardInput: path + " (standard input)"
            case .symlink: "\(path) -> \(entry.linkTarget)"
            default: path
            }
            Console.writeLine(TextFormat.rightAligned(size, width: 9) + "  " + shown, to: .output)
        }
        TransferReporter(json: json, role: .sender).leftOut(tree)
        let unknown = tree.entries.count { $0.flags.contains(.sizeUnknown) }
        let leftOut = tree.notSent.count
        if json {
            Console.emit("dry_run", [
                "entries": tree.entries.count, "files": files, "folders": folders, "links": links, "bytes": tree.totalSize,
                "size_unknown": unknown > 0, "excluded": tree.excluded, "failed": leftOut,
            ])
        } else {
            var parts = [count(files, "file", "files") + " (\(formatSize(tree.totalSize, filesOfUnknownSize: unknown)))"]
            if folders > 0 { parts.append(count(folders, "folder", "folders")) }
            if links > 0 { parts.append(count(links, "link", "links")) }
            var line = "would offer " + parts.joined(separator: ", ")
            if tree.excluded > 0 { line += "; \(tree.excluded) excluded" }
            if leftOut > 0 { line += "; \(count(leftOut, "item", "items")) named above would not be sent" }
            Console.writeLine(line + "; nothing sent (--dry-run)", to: .output)
        }
        // As the send would end: 74 for items it cannot read, else 77 for names qxfer/1 cannot carry.
        let code: TransferError.Code? = tree.unreadable > 0 ? .io : tree.unsentForTheirNames > 0 ? .unsafePath : nil
        if let code {
            throw TransferError(code, "\(count(leftOut, "item", "items")) named above would not be transferred (--dry-run: nothing was sent)")
        }
    }

    static func kindName(_ kind: EntryKind) -> String {
        switch kind {
        case .file: "file"
        case .directory: "folder"
        case .symlink: "symlink"
        }
    }
}
