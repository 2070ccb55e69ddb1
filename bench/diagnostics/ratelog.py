#!/usr/bin/env python3
"""Summarizes one per-ACK log of the diagnostic libngtcp2 (ngtcp2-0.12.1-ratelog.patch).

    python3 bench/diagnostics/ratelog.py LOG [LINK_BYTES_PER_SECOND]   # default 62.5e6

Lines: "S ts size inflight delivered pn" per packet sent, "R ts size" per datagram read,
"P ts bytes next=T sq=N" per pacing update, "A ts del= sendel= ackel= rate= ..." per rate
sample ngtcp2 accepted. Prints the rate samples against the link, send and read timestamp
patterns, the longest run of ACKs whose sample kept a frozen interval, and the bytes sent
between two reads (one delivery snapshot).
"""
import sys, re, collections
link = float(sys.argv[2]) if len(sys.argv) > 2 else 62.5e6
f = sys.argv[1]
rates=[]; sends=[]; reads=[]; paces=[]; best=[]
over=[]
for line in open(f):
    t = line[0]
    if t == 'A':
        p = line.split()
        d = dict(x.split('=') for x in p[2:])
        rates.append((int(p[1]), int(d['rate']), int(d['del']), int(d['sendel']), int(d['ackel']), int(d['applim']), int(d['best']), int(d['minrtt'])))
    elif t == 'S':
        p = line.split(); sends.append((int(p[1]), int(p[2])))
    elif t == 'R':
        p = line.split(); reads.append((int(p[1]), int(p[2])))
    elif t == 'P':
        p = line.split(); paces.append((int(p[1]), int(p[2])))
def pct(v, q): 
    v = sorted(v); return v[min(len(v)-1, int(q*len(v)))] if v else 0
r = [x[1] for x in rates]
print(f"{f}: {len(sends)} packets sent, {len(reads)} datagrams read, {len(rates)} rate samples")
if r:
    print("rate samples MB/s: p10 %.1f p50 %.1f p90 %.1f p99 %.1f max %.1f; > 1.25x link: %.1f %%; best(max) %.1f MB/s" % (
        pct(r,.1)/1e6, pct(r,.5)/1e6, pct(r,.9)/1e6, pct(r,.99)/1e6, max(r)/1e6, 100*sum(1 for x in r if x > 1.25*link)/len(r), max(x[6] for x in rates)/1e6))
    sd = sum(1 for x in rates if x[3] >= x[4]); print("interval = send_elapsed in %.1f %% of samples" % (100*sd/len(rates)))
    hi = [x for x in rates if x[1] > 1.25*link]
    for x in hi[:8]:
        print("  inflated: ts=%d rate=%.1f MB/s delivered=%d send_elapsed=%.2f ms ack_elapsed=%.2f ms min_rtt=%.2f ms" % (x[0], x[1]/1e6, x[2], x[3]/1e6, x[4]/1e6, x[7]/1e6))
# batches: runs of sends with identical ts
runs = collections.Counter(); i = 0
bursts = []
while i < len(sends):
    j = i
    while j < len(sends) and sends[j][0] == sends[i][0]: j += 1
    runs[j-i] += 1; bursts.append((sends[i][0], j-i, sum(s[1] for s in sends[i:j]))); i = j
if sends:
    n = sum(runs.values())
    print("send timestamps: %d distinct for %d packets; packets per timestamp p50 %d p90 %d max %d" % (n, len(sends), pct([b[1] for b in bursts], .5), pct([b[1] for b in bursts], .9), max(b[1] for b in bursts)))
    gaps = [ (bursts[k+1][0]-bursts[k][0]) for k in range(len(bursts)-1)]
    print("gap between send timestamps us: p10 %.0f p50 %.0f p90 %.0f" % (pct(gaps,.1)/1e3, pct(gaps,.5)/1e3, pct(gaps,.9)/1e3))
    # rate over 1ms windows of sent bytes
    span = (sends[-1][0]-sends[0][0])/1e9
    print("sent %.1f MB over %.2f s = %.1f MB/s" % (sum(s[1] for s in sends)/1e6, span, sum(s[1] for s in sends)/1e6/max(span,1e-9)))
if reads:
    rr=[]; i=0
    while i < len(reads):
        j=i
        while j < len(reads) and reads[j][0]==reads[i][0]: j+=1
        rr.append(j-i); i=j
    print("read timestamps: %d distinct for %d datagrams; per timestamp p50 %d p90 %d max %d; datagram bytes p50 %d" % (len(rr), len(reads), pct(rr,.5), pct(rr,.9), max(rr), pct([x[1] for x in reads], .5)))
# frozen samples: consecutive rate samples with unchanged (send_elapsed, ack_elapsed)
best_run = (0, None); cur = 0; prev = None; start = None
for x in rates:
    k = (x[3], x[4])
    if k == prev: cur += 1
    else:
        cur = 1; start = x
    prev = k
    if cur > best_run[0]: best_run = (cur, start, x)
if best_run[1]:
    a, b = best_run[1], best_run[2]
    print("longest frozen sample: %d ACKs over %.1f ms, delivered %d -> %d, rate %.1f -> %.1f MB/s" % (best_run[0], (b[0]-a[0])/1e6, a[2], b[2], a[1]/1e6, b[1]/1e6))
# bytes sent between two datagram reads (a burst with one delivery snapshot)
events = sorted([(t, 0, n) for t, n in sends] + [(t, 1, n) for t, n in reads])
bursts = []; acc = 0
for t, kind, n in events:
    if kind == 0: acc += n
    elif acc: bursts.append(acc); acc = 0
if bursts:
    print("bytes sent between two reads: p50 %d p90 %d p99 %d max %d" % (pct(bursts,.5), pct(bursts,.9), pct(bursts,.99), max(bursts)))
