// libFuzzer target: the resume journal parser, Journal.parse
// (Sources/QXferTransfer/Store/Journal.swift), which reads a file that another process, a
// torn write or a hostile local user may have left beside a partial file.
//
// Input: byte 0 chooses the mode; the rest is text (invalid UTF-8 repaired, as Journal.read
// refuses invalid UTF-8 before parsing). Mode even: the text is parsed as it is. Mode odd: the
// text is a journal body and the harness appends its correct `check` line, so the fuzzer gets
// past the checksum and reaches the field parsing. Oracles, beyond "never traps":
//  - an accepted journal's prefix digest is empty exactly when its offset is 0, and otherwise
//    as long as its algorithm's digest;
//  - writing an accepted journal out again and parsing that gives the same journal;
//  - a body whose check line is wrong is never accepted.

@_cdecl("LLVMFuzzerTestOneInput")
public func qxferFuzzJournal(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    guard let data, size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let text = String(decoding: input.dropFirst(), as: UTF8.self)
    let parsed: Journal?
    if input[0] & 1 == 0 {
        parsed = Journal.parse(text)
    } else {
        parsed = Journal.parse(text + "check \(Journal.check(text))\n")
        // The same body with a check line that is off by one digit must be refused.
        let good = Journal.check(text)
        let bad = String(good.dropLast()) + (good.last == "0" ? "1" : "0")
        precondition(Journal.parse(text + "check \(bad)\n") == nil, "accepted a journal with a wrong check line")
    }
    guard let journal = parsed else { return 0 }
    precondition(journal.prefixDigest.count == (journal.offset == 0 ? 0 : journal.algorithm.digestLength),
                 "accepted a prefix of \(journal.prefixDigest.count) bytes at offset \(journal.offset)")
    let rewritten = journal.body + "check \(Journal.check(journal.body))\n"
    precondition(Journal.parse(rewritten) == journal, "a journal written out again parses differently")
    return 0
}
