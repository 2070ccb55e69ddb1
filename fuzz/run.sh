#!/usr/bin/env bash
# Builds and runs qxfer's libFuzzer targets (fuzz/harness/*.swift), one binary per parser,
# each compiled with swiftc -sanitize=fuzzer,address together with the project's own source
# files it exercises (no SwiftPM: the parsers need only the standard library, Foundation, Glibc,
# libxxhash for the journal's check line (FastHash's, SafeOutput's, LinuxSystem's and PlainText's few Swift files are compiled
# into the same module, hence `#if canImport` around their imports), and for the QUIC engine its C shim, ngtcp2 and GnuTLS).
#
#   fuzz/run.sh [TARGET...]        build, then run each target for $FUZZ_SECONDS (default 60)
#   fuzz/run.sh build [TARGET...]  build only
#   fuzz/run.sh seeds              regenerate the seed corpora in fuzz/corpus/ (committed)
#
# Targets: codec frames paths journal dns framers media streamwire quic session relay peer. Seeds are read from
# fuzz/corpus/TARGET; new inputs the fuzzer finds go to $FUZZ_BUILD/corpus/TARGET (not
# committed), crashes to $FUZZ_BUILD/artifacts/TARGET/. The last lines printed are one summary
# line per target: executions (libFuzzer's stat::number_of_executed_units) and its final
# cov:/ft: figures.
# Exit status: non-zero if any target crashed, leaked, timed out or did not build.
set -euo pipefail
cd "$(dirname "$0")/.."

SWIFTC=${SWIFTC:-swiftc}
OUT=${FUZZ_BUILD:-.build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
ALL_TARGETS=(codec frames paths journal dns framers media streamwire quic session relay peer)

T=Sources/QXferTransfer
D=Sources/QXferDiscovery
S=Sources/QXferStream
# TransferError escapes its messages (TerminalText); TextFormat formats numbers.
PLAIN="Sources/PlainText/TerminalText.swift Sources/PlainText/TextFormat.swift"
WIRE="$T/Wire/MessageCodec.swift $T/Wire/Messages.swift $T/Limits.swift $T/TransferError.swift $T/SaturatingArithmetic.swift $PLAIN"
# The receiver's and sender's decisions after decoding, with the file store they write through.
SESSION="$T/Receiver/OfferPlanner.swift $T/Receiver/ReceivingSession.swift $T/Sender/SenderLedger.swift $T/Session/InboundFunnel.swift
  $T/Session/TransferProgress.swift $T/Store/FileStore.swift $T/Store/Journal.swift $T/Paths/TargetDirectory.swift
  $T/Paths/SafePath.swift $T/Paths/ExactString.swift $T/Hashing/Digest.swift $T/Store/FileCommitter.swift Sources/LinuxSystem/Locked.swift
  Sources/LinuxSystem/DetachedThread.swift Sources/FastHash/XXH3.swift Sources/SafeOutput/RenameAt.swift fuzz/support/SessionSupport.swift"
# The relay's decoders and its room table (Sources/QXferReach/Relay, without the NIO glue).
R=Sources/QXferReach
RELAY="$R/Relay/RelayWire.swift $R/Relay/ClientAddress.swift $R/Relay/RelayLimits.swift $R/Relay/RelayRooms.swift
  $R/Relay/RelayStatistics.swift $R/ReachError.swift"
# What a peer reads from the other and the path engine fed it (Sources/QXferReach/Path, no NIO).
PEER="$R/Path/PeerSignal.swift $R/Path/PathEngine.swift $R/Relay/RelayWire.swift"
STREAM="$S/WireFormat.swift $S/Bytes.swift $S/Frame.swift $S/RealtimeDatagrams.swift $S/ReedSolomon.swift $S/OutputBound.swift Sources/PlainText/TextFormat.swift"
CXXHASH=(-Xcc -fmodule-map-file=fuzz/support/CXXHash.modulemap -I Sources/CXXHash/include -lxxhash
  -Xcc -fmodule-map-file=fuzz/support/CFileSystemLinux.modulemap -I Sources/CFileSystemLinux/include)
# The QUIC engine's C shim is compiled apart (as SwiftPM does) and linked with ngtcp2 and GnuTLS.
CNGTCP2=(-Xcc -fmodule-map-file=fuzz/support/CNGTCP2.modulemap -I Sources/CNGTCP2/include "$OUT/cngtcp2-shims.o")

sources() {
    case "$1" in
        codec)   echo "fuzz/harness/FuzzCodec.swift $WIRE" ;;
        frames)  echo "fuzz/harness/FuzzFrames.swift $WIRE" ;;
        paths)   echo "fuzz/harness/FuzzPaths.swift $T/Paths/SafePath.swift $T/Paths/ExactString.swift $T/Limits.swift $T/TransferError.swift $PLAIN" ;;
        journal) echo "fuzz/harness/FuzzJournal.swift $T/Store/Journal.swift $T/Paths/TargetDirectory.swift $T/Paths/SafePath.swift $T/Paths/ExactString.swift $WIRE Sources/SafeOutput/RenameAt.swift fuzz/support/JournalSupport.swift" ;;
        dns)     echo "fuzz/harness/FuzzDNS.swift $D/DNSCodec.swift $D/DNSMessage.swift $D/DNSName.swift" ;;
        framers) echo "fuzz/harness/FuzzFramers.swift Sources/QXferCore/FrameRules.swift Sources/QXferCore/QXferError.swift" ;;
        media)   echo "fuzz/harness/FuzzMedia.swift $S/MediaFiles.swift $S/FrameAssembler.swift $STREAM Sources/SafeOutput/OutputFile.swift Sources/SafeOutput/OutputKind.swift" ;;
        streamwire) echo "fuzz/harness/FuzzStreamWire.swift $S/FrameAssembler.swift $STREAM" ;;
        quic)    echo "fuzz/harness/FuzzQUIC.swift $(echo Sources/QUICEngine/*.swift)" ;;
        session) echo "fuzz/harness/FuzzSession.swift $SESSION $WIRE" ;;
        relay)   echo "fuzz/harness/FuzzRelay.swift fuzz/support/FuzzScript.swift $RELAY" ;;
        peer)    echo "fuzz/harness/FuzzPeer.swift fuzz/support/FuzzScript.swift $PEER" ;;
        *) echo "unknown fuzz target '$1' (targets: ${ALL_TARGETS[*]})" >&2; return 1 ;;
    esac
}

build() {
    local target=$1 binary="$OUT/fuzz-$target" newer
    mkdir -p "$OUT"
    # shellcheck disable=SC2046
    if [ -x "$binary" ]; then
        newer=$(find $(sources "$target") Sources/CNGTCP2 fuzz/support fuzz/run.sh -newer "$binary" | head -1)
        [ -z "$newer" ] && { echo "== fuzz-$target is up to date"; return 0; }
    fi
    echo "== building fuzz-$target"
    local extra=("${CXXHASH[@]}")
    if [ "$target" = quic ]; then
        "${CLANG:-clang}" -c -O1 -g -fsanitize=address,fuzzer-no-link -I Sources/CNGTCP2/include \
            Sources/CNGTCP2/shims.c -o "$OUT/cngtcp2-shims.o"
        extra=("${CNGTCP2[@]}")
    fi
    # shellcheck disable=SC2046
    "$SWIFTC" -swift-version 6 -O -g -sanitize=fuzzer,address -parse-as-library \
        -module-name "QXferFuzz_$target" -module-cache-path "$OUT/module-cache" \
        "${extra[@]}" $(sources "$target") -o "$OUT/fuzz-$target" 2>&1 \
        | { grep -v "Cannot export local symbol '__asan" || true; }
    return "${PIPESTATUS[0]}"
}

run() {
    local target=$1 log="$OUT/logs/$target.log"
    mkdir -p "$OUT/corpus/$target" "$OUT/artifacts/$target" "$OUT/logs"
    echo "== fuzzing $target for ${FUZZ_SECONDS}s"
    local status=0
    # Swift's own crash backtracer trips AddressSanitizer; libFuzzer's handler reports instead.
    SWIFT_BACKTRACE=enable=no "$OUT/fuzz-$target" "$OUT/corpus/$target" "fuzz/corpus/$target" \
        -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -use_value_profile=1 \
        -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix="$OUT/artifacts/$target/" >"$log" 2>&1 || status=$?
    local execs cov
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    cov=$(grep -E '^#[0-9]+' "$log" | grep -o 'cov: [0-9]* ft: [0-9]* corp: [^ ]*' | tail -1)
    local line
    line=$(printf '%-8s executions %-10s %s  exit %s' "$target" "${execs:-?}" "${cov:-cov: ?}" "$status")
    echo "$line" | tee -a "$OUT/summary.txt"
    if [ "$status" -ne 0 ]; then
        grep -E 'ERROR: libFuzzer|Fatal error|SUMMARY|Test unit written|Precondition failed' "$log" | head -8 || true
        return 1
    fi
}

mode=run
case "${1:-}" in
    build|seeds) mode=$1; shift ;;
esac
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ALL_TARGETS[@]}")

if [ "$mode" = seeds ]; then
    mkdir -p "$OUT"
    # shellcheck disable=SC2046
    "$SWIFTC" -swift-version 6 -module-name QXferFuzzSeeds -module-cache-path "$OUT/module-cache" \
        "${CXXHASH[@]}" fuzz/seeds/main.swift $WIRE $T/Store/Journal.swift $T/Paths/TargetDirectory.swift \
        $T/Paths/SafePath.swift $T/Paths/ExactString.swift Sources/SafeOutput/RenameAt.swift fuzz/support/JournalSupport.swift \
        $D/DNSCodec.swift $D/DNSMessage.swift $D/DNSName.swift -o "$OUT/seeds"
    "$OUT/seeds" fuzz/corpus
    python3 fuzz/seeds/wire_seeds.py fuzz/corpus
    exit 0
fi

failed=0
for target in "${targets[@]}"; do
    build "$target" || { echo "$target: build failed"; failed=1; continue; }
done
[ "$mode" = build ] && exit $failed
: > "$OUT/summary.txt"
for target in "${targets[@]}"; do
    [ -x "$OUT/fuzz-$target" ] || continue
    run "$target" || failed=1
done
echo "== summary (FUZZ_SECONDS=$FUZZ_SECONDS)"
cat "$OUT/summary.txt"
exit $failed
