#!/usr/bin/env python3
"""Markdown tables and PNG plots from the benchmark results (bench/results/*).

    bench/report.py transfer CSV...      # bench/transfer.sh: per condition and tool, ratios, targets
    bench/report.py small [--rtt-ms 50] CSV...   # bench/small.sh: 1 KiB over 50 ms RTT, in RTTs
    bench/report.py stream JSONL...      # bench/stream.sh: on-time share and latency per mode
    bench/report.py plot --transfer CSV --stream JSONL --out docs/   # PNGs (needs matplotlib)

Several files of one kind are read as one run set (rows are grouped by condition and tool).
Only the standard library is needed for the tables; the plots import matplotlib.
"""
import csv
import json
import statistics
import sys
from collections import OrderedDict, defaultdict

CONDITION_TITLES = {
    "loopback": "loopback",
    "wan": "WAN 50 ms RTT, 500 Mbit/s",
    "wan-loss": "WAN + 1 % loss each way",
}
PEER_PREFIXES = ("scp", "rsync", "iperf3", "ngtcp2")


def is_peer(tool):
    return tool.startswith(PEER_PREFIXES)


def read_transfer(paths):
    groups = OrderedDict()
    for path in paths:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                groups.setdefault((row["condition"], row["tool"]), []).append(row)
    return groups


def summarize_transfer(groups):
    """Per (condition, tool): median MB/s, spread, CPU s/GB per side, peak RSS, completeness."""
    summary = OrderedDict()
    for key, rows in groups.items():
        rates = sorted(float(r["mb_per_s"]) for r in rows)
        gigabytes = [int(r["bytes"]) / 1e9 for r in rows]
        summary[key] = {
            "median": statistics.median(rates),
            "low": rates[0],
            "high": rates[-1],
            "runs": len(rates),
            "sender_cpu": statistics.median(float(r["sender_cpu_s"]) / g for r, g in zip(rows, gigabytes)),
            "receiver_cpu": statistics.median(float(r["receiver_cpu_s"]) / g for r, g in zip(rows, gigabytes)),
            "sender_rss": max(int(r["sender_rss_kib"]) for r in rows) / 1024,
            "receiver_rss": max(int(r["receiver_rss_kib"]) for r in rows) / 1024,
            "complete": all(r.get("complete", "1") == "1" for r in rows),
            "loads": [float(r["load1"]) for r in rows if r.get("load1")],
            "drops": statistics.median(int(r["link_drops"]) for r in rows) if all(r.get("link_drops") for r in rows) else None,
        }
    return summary


def ratio(summary, condition, tool, peer):
    a, b = summary.get((condition, tool)), summary.get((condition, peer))
    if not a or not b or b["median"] <= 0:
        return None
    return a["median"] / b["median"]


def best_peer(summary, condition, prefix="", exclude=None):
    peers = [(v["median"], tool) for (c, tool), v in summary.items()
             if c == condition and is_peer(tool) and tool.startswith(prefix) and not (exclude and tool.startswith(exclude))]
    return max(peers)[1] if peers else None


def fmt_ratio(value):
    return "–" if value is None else f"{value:.2f}×"


def transfer_tables(paths):
    summary = summarize_transfer(read_transfer(paths))
    conditions = list(OrderedDict.fromkeys(c for c, _ in summary))
    out = []
    out.append("| condition | tool | MB/s median | min–max (runs) | CPU s/GB sender / receiver | peak RSS MiB sender / receiver | × scp | × best file peer | × best iperf3 | queue drops |")
    out.append("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for condition in conditions:
        best = best_peer(summary, condition, exclude="iperf3")
        ceiling = best_peer(summary, condition, "iperf3")
        for (c, tool), v in summary.items():
            if c != condition:
                continue
            rss = " / ".join(f"{x:.0f}" if x > 0 else "–" for x in (v["sender_rss"], v["receiver_rss"]))
            cpu = " / ".join(f"{x:.2f}" if x > 0 else "–" for x in (v["sender_cpu"], v["receiver_cpu"]))
            mark = "" if v["complete"] else " (stopped at CAP)"
            drops = "–" if v["drops"] is None else f"{v['drops']:.0f}"
            best_text = "–" if is_peer(tool) or not best else f"{fmt_ratio(ratio(summary, condition, tool, best))} {best}"
            ceiling_text = "–" if not ceiling or tool.startswith("iperf3") else fmt_ratio(ratio(summary, condition, tool, ceiling))
            out.append(
                f"| {condition} | {tool}{mark} | {v['median']:.1f} | {v['low']:.1f}–{v['high']:.1f} ({v['runs']}) | {cpu} | {rss} | "
                f"{fmt_ratio(ratio(summary, condition, tool, 'scp'))} | {best_text} | {ceiling_text} | "
                f"{drops} |"
            )
    out.append("")
    out.append("File peers: scp, rsync, the ngtcp2 example pair; iperf3 moves memory to memory without encryption (the ceiling). "
               "Queue drops: packets the link emulator's queue dropped during the run, both directions (median).")
    out.append("")
    out.extend(target_lines(summary))
    out.extend(baseline_lines(summary))
    loads = [x for v in summary.values() for x in v["loads"]]
    if loads:
        out.append("")
        out.append(f"Load average (1 min) at the end of each run: median {statistics.median(loads):.2f}, min {min(loads):.2f}, max {max(loads):.2f}.")
    return "\n".join(out)


def baseline_lines(summary):
    """qxfer-X against baseline-X (bench/transfer.sh's QXFER_BASELINE) where a run has both."""
    lines = []
    for (condition, tool), after in summary.items():
        before = summary.get((condition, tool.replace("qxfer-", "baseline-", 1))) if tool.startswith("qxfer-") else None
        if not before or before["median"] <= 0:
            continue
        lines.append(
            f"- {condition}, {tool}: {after['median']:.1f} against {before['median']:.1f} MB/s ({after['median'] / before['median']:.2f}×); "
            f"CPU s/GB sender {after['sender_cpu']:.2f} against {before['sender_cpu']:.2f}, receiver {after['receiver_cpu']:.2f} against {before['receiver_cpu']:.2f}; "
            f"peak RSS MiB {after['sender_rss']:.0f} / {after['receiver_rss']:.0f} against {before['sender_rss']:.0f} / {before['receiver_rss']:.0f}"
        )
    return ["", "This binary against the baseline (QXFER_BASELINE), same run:"] + lines if lines else []


def target_lines(summary):
    """The Targets of DESIGN.md that this run can check, with the measured ratio."""
    checks = []

    def check(condition, tool, peer, target, label=None):
        if peer is None:
            return
        value = ratio(summary, condition, tool, peer)
        if value is None:
            return
        verdict = "meets" if value >= target else "**short of**"
        checks.append(f"- {condition}: {tool} / {label or peer} = **{value:.2f}×** (target ≥ {target}×: {verdict})")

    check("loopback", "qxfer-tls", "scp", 1.3)
    check("loopback", "qxfer-quic", "scp", 1.0)
    check("loopback", "qxfer-quic", best_peer(summary, "loopback", "ngtcp2"), 2.0, "best ngtcp2 example")
    for tool in ("qxfer-quic", "qxfer-tls"):
        check("wan", tool, best_peer(summary, "wan", "iperf3"), 0.95, "best iperf3")
    for tool in ("qxfer-quic", "qxfer-tls"):
        check("wan-loss", tool, "iperf3-bbr", 0.9)
        check("wan-loss", tool, "scp", 3.0)
    check("loopback", "qxfer-quic", "scp", 1.5)
    # Issue 18: QUIC at least TCP+TLS on more paths. Where both fill the link QUIC's per-packet
    # overhead leaves it ~1 % short by construction; the -stock paths are where TCP's buffer
    # limits, as Linux sets them, do not reach the bandwidth-delay product.
    for condition in ("wan-long", "wan-lossy", "wan-far", "wan-far-stock", "wan-ocean-stock", "wan-jitter"):
        check(condition, "qxfer-quic", "qxfer-tls", 1.0)
    # A fast LAN at MTU 1500 (issue 19): QUIC's per-packet cost against its own TCP+TLS stack.
    check("veth", "qxfer-quic", "qxfer-tls", 0.6)
    check("veth", "qxfer-quic", best_peer(summary, "veth", "ngtcp2"), 2.0, "best ngtcp2 example")
    for condition in ("wan", "wan-loss", "wan-long", "wan-lossy", "wan-jitter"):
        quic, example = summary.get((condition, "qxfer-quic")), summary.get((condition, "ngtcp2-bbr"))
        if quic and example and quic["drops"] is not None and example["drops"] is not None:
            verdict = "meets" if quic["drops"] <= example["drops"] else "**short of**"
            checks.append(f"- {condition}: qxfer-quic queue drops {quic['drops']:.0f} vs ngtcp2-bbr {example['drops']:.0f} (target ≤: {verdict})")
    for condition in ("loopback", "veth", "wan", "wan-loss"):
        scp = summary.get((condition, "scp"))
        if not scp or scp["sender_cpu"] <= 0:
            continue
        scp_total = scp["sender_cpu"] + scp["receiver_cpu"]
        for tool in ("qxfer-quic", "qxfer-tls"):
            v = summary.get((condition, tool))
            if v:
                total = v["sender_cpu"] + v["receiver_cpu"]
                verdict = "meets" if total <= scp_total else "**short of**"
                checks.append(f"- {condition}: {tool} CPU, both sides, {total:.2f} s/GB vs scp {scp_total:.2f} (target ≤ scp: {verdict})")
    rss = [(v["sender_rss"], v["receiver_rss"], c, t) for (c, t), v in summary.items() if t.startswith("qxfer")]
    if rss:
        worst = max(rss, key=lambda x: max(x[0], x[1]))
        verdict = "meets" if max(worst[0], worst[1]) < 64 else "**short of**"
        checks.append(f"- qxfer peak RSS, largest: {max(worst[0], worst[1]):.0f} MiB ({worst[3]}, {worst[2]}; target < 64 MiB: {verdict})")
    return checks


def small_table(paths, rtt_ms):
    """Wall time of each tool's runs in a transfer CSV (bench/small.sh: 1 KiB), in ms and RTTs."""
    rows = OrderedDict()
    for (condition, tool), group in read_transfer(paths).items():
        rows.setdefault(tool, []).extend(float(r["seconds"]) for r in group)
    out = ["| tool | median ms | min–max ms (runs) | median in RTTs |", "|---|---:|---|---:|"]
    for tool, values in rows.items():
        values.sort()
        median = statistics.median(values) * 1000
        out.append(f"| {tool} | {median:.0f} | {values[0] * 1000:.0f}–{values[-1] * 1000:.0f} ({len(values)}) | {median / rtt_ms:.1f} |")
    return "\n".join(out)


def read_stream(paths):
    runs = []
    for path in paths:
        with open(path) as handle:
            runs.extend(json.loads(line) for line in handle if line.strip())
    return runs


def stream_label(run):
    if run.get("stack") == "srt":
        return "srt-live-transmit (120 ms latency)"
    if run.get("stack") == "tcp":
        return f"plain TCP ({run.get('repair')})"
    repair = run.get("repair")
    mode = run.get("requested_mode") or run.get("mode")
    return f"qxfer {run.get('stack')} {mode}" + (f" ({repair})" if repair and repair not in ("none", "-") and mode == "realtime" else "")


def stream_table(paths):
    groups = OrderedDict()
    for run in read_stream(paths):
        groups.setdefault((run.get("loss_percent"), stream_label(run)), []).append(run)
    out = ["| loss each way | sender | on time (median) | late / lost frames | p50 ms | p99 ms | max ms | runs |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (loss, label), runs in groups.items():
        med = lambda f: statistics.median(f(r) for r in runs)
        out.append(
            f"| {loss} % | {label} | {med(lambda r: r['delivered_ratio']) * 100:.2f} % | {med(lambda r: r['frames_late']):.0f} / {med(lambda r: r['frames_lost']):.0f} | "
            f"{med(lambda r: r['latency_ms']['p50']):.1f} | {med(lambda r: r['latency_ms']['p99']):.1f} | {med(lambda r: r['latency_ms']['max']):.1f} | {len(runs)} |"
        )
    return "\n".join(out)


def plot(transfer_paths, stream_paths, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    written = []
    if transfer_paths:
        rows = read_transfer(transfer_paths)
        summary = summarize_transfer(rows)
        size = max(int(r["bytes"]) for group in rows.values() for r in group)
        size_label = f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / 2**20:g} MiB"
        runs = max(len(group) for group in rows.values())
        conditions = list(OrderedDict.fromkeys(c for c, _ in summary))
        fig, axes = plt.subplots(1, len(conditions), figsize=(5.2 * len(conditions), 4.8), squeeze=False)
        for ax, condition in zip(axes[0], conditions):
            items = [(t, v) for (c, t), v in summary.items() if c == condition]
            items.sort(key=lambda item: item[1]["median"])
            names = [t + ("*" if not v["complete"] else "") for t, v in items]
            medians = [v["median"] for _, v in items]
            errors = [[v["median"] - v["low"] for _, v in items], [v["high"] - v["median"] for _, v in items]]
            colors = ["tab:blue" if t.startswith("qxfer") else "tab:gray" for t, _ in items]
            ax.barh(names, medians, xerr=errors, color=colors, capsize=3)
            for y, value in enumerate(medians):
                ax.text(value, y, f" {value:.0f}" if value >= 10 else f" {value:.1f}", va="center", fontsize=8)
            ax.set_title(CONDITION_TITLES.get(condition, condition))
            ax.set_xlabel("MB/s (median, bars: min–max)")
            ax.set_xscale("log" if max(medians) / max(min(medians), 1e-3) > 50 else "linear")
        fig.suptitle(f"{size_label} file transfer, {runs} run{'s' if runs > 1 else ''} each: qxfer (blue) vs peers (grey); * stopped at the time cap")
        fig.tight_layout()
        path = f"{out_dir}/bench-throughput.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    if stream_paths:
        runs = read_stream(stream_paths)
        losses = sorted({r.get("loss_percent") for r in runs})
        fig, axes = plt.subplots(1, len(losses), figsize=(6.5 * len(losses), 4.6), squeeze=False)
        quantiles = [("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0)]
        for ax, loss in zip(axes[0], losses):
            groups = OrderedDict()
            for run in runs:
                if run.get("loss_percent") == loss:
                    groups.setdefault(stream_label(run), []).append(run)
            for label, group in groups.items():
                xs = [statistics.median(r["latency_ms"][q] for r in group) for q, _ in quantiles]
                ys = [p for _, p in quantiles]
                delivered = statistics.median(r["delivered_ratio"] for r in group)
                ax.plot(xs, ys, marker="o", label=f"{label}: {delivered * 100:.2f} % on time")
            ax.axvline(60, color="red", linestyle=":", linewidth=1)
            ax.text(60, 0.47, " target p99 60 ms", color="red", fontsize=8)
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xticks([t for t in (20, 30, 50, 100, 200, 500, 1000, 2000, 5000, 10000)])
            ax.set_xlabel("one-way frame latency, ms (log)")
            ax.set_ylabel("share of frames at or below")
            ax.set_title(f"30 fps, 4 Mbit/s, 50 ms RTT, {loss} % loss each way")
            ax.legend(fontsize=7, loc="lower right")
            ax.grid(True, which="both", alpha=0.3)
        fig.suptitle("Streaming one-way latency: p50, p95, p99, max (medians over runs)", fontsize=10)
        fig.tight_layout()
        path = f"{out_dir}/bench-stream-latency.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    kind, rest = argv[1], argv[2:]
    if kind == "transfer":
        print(transfer_tables(rest))
    elif kind == "small":
        rtt_ms = 50.0
        if rest[:1] == ["--rtt-ms"]:
            rtt_ms, rest = float(rest[1]), rest[2:]
        print(small_table(rest, rtt_ms))
    elif kind == "stream":
        print(stream_table(rest))
    elif kind == "plot":
        import argparse

        parser = argparse.ArgumentParser(prog="report.py plot")
        parser.add_argument("--transfer", action="append", default=[], help="a transfer CSV (repeatable)")
        parser.add_argument("--stream", action="append", default=[], help="a stream JSONL (repeatable)")
        parser.add_argument("--out", default="docs", help="directory for the PNGs")
        args = parser.parse_args(rest)
        for path in plot(args.transfer, args.stream, args.out):
            print(f"wrote {path}")
    else:
        print(f"report.py: unknown kind '{kind}' (transfer, small, stream, plot)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
