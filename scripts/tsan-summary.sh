#!/usr/bin/env bash
# Prints ThreadSanitizer's reports from the files TSAN_OPTIONS=log_path wrote into folder $1,
# one line each, last: the kind of report and the source lines of the two accesses (make test
# runs it after a failed TSan step, since CI keeps only the tail of a log; the files hold the rest).
set -uo pipefail
shopt -s nullglob
reports=("$1"/tsan.*)
[ ${#reports[@]} -gt 0 ] || { echo "tsan-summary: no ThreadSanitizer report in $1"; exit 0; }
echo "ThreadSanitizer reports (whole text in ${reports[*]}):"
for report in "${reports[@]}"; do
    # Per report: its kind, then the first project source line of each access's stack.
    awk '/^WARNING: ThreadSanitizer: / { if (line != "") print line; sub(/^WARNING: ThreadSanitizer: /, ""); sub(/ \(pid=.*/, ""); line = $0; want = 0; next }
         /^  [A-Z].* (access|read|write)/ || /^  Previous / { want = 1; next }
         want && match($0, /\/(Sources|Tests)\/[^ ]*:[0-9]+/) { line = line "  " substr($0, RSTART + 1, RLENGTH - 1); want = 0 }
         END { if (line != "") print line }' "$report"
done | sort | uniq -c | sort -rn | head -20
