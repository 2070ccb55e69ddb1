# shellcheck shell=bash
# bench_build_qxfer SCRATCH: unless QXFER is set, builds qxfer and qxfer-linkemu (release, with
# --scratch-path SCRATCH) and sets QXFER to the built qxfer; then exports LINKEMU_BIN (unless
# set) as the qxfer-linkemu beside QXFER. Sourced by bench/run.sh, bench/transfer.sh and
# bench/file-peers.sh.
bench_build_qxfer() {
    if [ -z "${QXFER:-}" ]; then
        echo "building qxfer and qxfer-linkemu (release, --scratch-path $1)" >&2
        swift build -c release --static-swift-stdlib --scratch-path "$1" --product qxfer >&2
        swift build -c release --static-swift-stdlib --scratch-path "$1" --product qxfer-linkemu >&2
        QXFER="$(swift build -c release --scratch-path "$1" --show-bin-path)/qxfer"
    fi
    export LINKEMU_BIN=${LINKEMU_BIN:-$(dirname "$QXFER")/qxfer-linkemu}
}
