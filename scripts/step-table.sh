#!/usr/bin/env bash
# Prints the steps a `make test` or `make check` run has taken so far, slowest first, with
# their times and the total, from the file scripts/test-step.sh appends to (STEP_TIMES):
#
#   scripts/step-table.sh FILE
set -euo pipefail
file=$1
[[ -s "$file" ]] || exit 0
echo "== steps of this run, slowest first"
sort -t $'\t' -k1,1nr "$file" | awk -F '\t' '
    function clock(s) { return sprintf("%d:%02d", s / 60, s % 60) }
    {
        total += $1
        command = length($3) > 96 ? substr($3, 1, 93) "..." : $3
        printf "%8s  %-6s %s\n", clock($1), ($2 == 0 ? "ok" : "exit " $2), command
    }
    END { printf "%8s  total of %d steps\n", clock(total), NR }'
