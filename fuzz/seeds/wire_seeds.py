#!/usr/bin/env python3
"""Seed corpora for the fuzz targets framers, media, streamwire, quic and session (fuzz/harness/), written
byte by byte after the layouts in docs/PROTOCOL.md and docs/STREAMING.md (the harnesses check
that what parses re-encodes to the same bytes, so a seed that disagreed with the Swift encoders
would show at once). The QUIC seeds are real client Initials from aioquic (PyPI), an independent
implementation. Run by `fuzz/run.sh seeds`; the output is committed.

    python3 fuzz/seeds/wire_seeds.py [ROOT]     # ROOT defaults to fuzz/corpus
"""
import json
import os
import plistlib
import struct
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus"


def write(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data)


# framers: byte 0 the framer (0 TLV, 1 Coder/JSON, 2 Coder/plist), byte 1 the limit / 64.
samples = [
    {"hello": {"name": "ada", "version": 1, "flags": [True, False]}},
    {"chunk": {"id": 7, "bytes": "aGVsbG8=", "tags": {"a": 1, "b": -2}}},
    {"nested": {"_0": [{"empty": {}}, {"hello": {"name": "", "version": -9, "flags": []}}]}},
    {"empty": {}},
]
tlv = b"".join(struct.pack(">II", t, len(p)) + p for t, p in [(1, b"hello"), (7, b""), (0xFFFFFFFF, b"x" * 40)])
write("framers", "tlv", bytes([0, 4]) + tlv)
write("framers", "tlv-over-limit", bytes([0, 1]) + struct.pack(">II", 1, 65) + b"y" * 65)
for i, sample in enumerate(samples):
    body = json.dumps(sample).encode()
    write("framers", f"json-{i}", bytes([1, 16]) + struct.pack(">I", len(body)) + body)
    plist = dict(sample)
    if "chunk" in plist:
        plist = {"chunk": {"id": 7, "bytes": b"hello", "tags": {"a": 1, "b": -2}}}
    body = plistlib.dumps(plist, fmt=plistlib.FMT_BINARY)
    write("framers", f"plist-{i}", bytes([2, 16]) + struct.pack(">I", len(body)) + body)

# media: IVF (VP8, VP9, AV1 keyframe and not) and Y4M (4:2:0, 4:4:4, mono, 10-bit).
def ivf(fourcc, frames, rate=30, scale=1):
    header = b"DKIF" + struct.pack("<HH4sHHIIII", 0, 32, fourcc, 64, 48, rate, scale, len(frames), 0)
    return header + b"".join(struct.pack("<IQ", len(f), pts) + f for pts, f in enumerate(frames))

write("media", "vp8.ivf", ivf(b"VP80", [b"\x10\x02\x00\x9d\x01\x2a" + b"\x00" * 20, b"\x31" + b"\x00" * 9]))
write("media", "vp9.ivf", ivf(b"VP90", [b"\x82\x49\x83\x42" + b"\x00" * 12, b"\x86" + b"\x00" * 5]))
write("media", "av1.ivf", ivf(b"AV01", [b"\x12\x00\x0a\x0b\x00\x00\x00\x24\xc4\xff\xdf\x00\x68\x02", b"\x32\x03\x10\x00\x00"], 1000, 33))
write("media", "empty.ivf", ivf(b"QXSY", []))
write("media", "420.y4m", b"YUV4MPEG2 W4 H2 F30:1 Ip A1:1 C420jpeg\n" + (b"FRAME\n" + bytes(range(12))) * 2)
write("media", "444.y4m", b"YUV4MPEG2 W2 H2 F25:1 C444\nFRAME Ixyz\n" + bytes(12))
write("media", "mono.y4m", b"YUV4MPEG2 W3 H1 F1:1 Cmono\nFRAME\n" + b"abc")
write("media", "10bit.y4m", b"YUV4MPEG2 W2 H2 F60000:1001 C420p10 XYSCSS=420P10\nFRAME\n" + bytes(12))
# Issue 66 §3: a 4x4 C444 picture whose 48 bytes, the input's tail, are the writer's script: pairs of
# (log2 of the number jump, timing: 10 ms steps, top bit captured 10 s in the past).
write("media", "gaps.y4m", b"YUV4MPEG2 W4 H4 F30:1 C444\nFRAME\n" + bytes([0, 3, 0, 3, 16, 0x83, 0, 3, 63, 0x80] + [0, 1] * 19))

# streamwire: byte 0 the mode (0 control stream, 1 one datagram, 2 reassembly, 3 gaps after a hello).
def message(kind, body):
    return struct.pack(">BI", kind, len(body)) + body

hello = struct.pack(">BBBIIIBI", 1, 2, 3, 30, 1, 200, 1, 32) + ivf(b"VP80", [])[:32]
control = (message(1, hello) + message(2, b"") + message(3, struct.pack(">IQ", 1, 10**18))
           + message(4, struct.pack(">IQQQ", 1, 1, 2, 3))
           + message(5, struct.pack(">QQQIB", 0, 5 * 10**9, 0, 200, 1) + b"frame bytes")
           + message(6, struct.pack(">Q", 1)) + message(7, b'{"frames_sent": 1}'))
write("streamwire", "control", bytes([0, 3, 1, 7, 64, 2, 9, 5, 1]) + control)

def shard(index, length, size, block, blocks, position, data_shards, parity, payload, flags=1):
    return struct.pack(">BQQQIIBHHHBBB", 0x10, index, 5 * 10**9, index, 200, length, flags, size, block, blocks,
                       position, data_shards, parity) + payload

write("streamwire", "shard", bytes([1]) + shard(3, 10, 1157, 0, 1, 0, 1, 2, bytes(10)))
write("streamwire", "parity", bytes([1]) + shard(3, 3000, 1157, 0, 1, 3, 3, 2, bytes(1157)))
write("streamwire", "nack", bytes([1]) + struct.pack(">BQH", 0x11, 9, 2) + struct.pack(">HBHB", 0, 1, 0, 2))
write("streamwire", "nack-all", bytes([1]) + struct.pack(">BQH", 0x11, 9, 0xFFFF))
write("streamwire", "padding", bytes([1, 0x12]) + bytes(64))
write("streamwire", "reassembly-fec", bytes([2, 0, 0x10, 0x00, 200]) + bytes([0, 5, 5, 2, 3, 0x85, 5, 5]))
write("streamwire", "reassembly-nack", bytes([2, 1, 0x20, 0x00, 100]) + bytes([0, 0, 5, 0x90, 5, 5, 2, 3, 5]))
write("streamwire", "reassembly-own", bytes([2, 2, 0x01, 0x00, 255, 4, 20]) + shard(9, 10, 1157, 0, 1, 0, 1, 2, bytes(10))[:120])
# streamwire mode 3, issue 66 §3: a hello (rate numerator u16, its shift, denominator u16, deadline / 4 ms), then
# frames (number jump u16, its shift, timing: 10 ms steps in the low 6 bits, capture kind in the top 2):
# pictures 0 and 65 536 captured 10 s in the past; then jumps of 2^40 and to the end of the range.
write("streamwire", "gaps-after-hello", bytes([3, 0, 30, 0, 0, 1, 25]) + bytes([0, 0, 0, 0x01, 0, 1, 16, 0x41, 0, 1, 40, 0x7F, 0xFF, 0xFF, 47, 0xC0]))
# ... the same at 4·10⁹ frames a second (30 << 27 ≈ 4·10⁹), many small jumps over a second.
write("streamwire", "gaps-fast-rate", bytes([3, 0, 30, 27, 0, 1, 25]) + bytes([0, 2, 0, 0x02] * 20 + [0xFF, 0xFF, 0, 0x45]))

# quic: byte 0 the mode (even: before the handshake, odd: after); then u16-length datagrams.
def datagrams(items):
    return b"".join(struct.pack(">H", len(d)) + d for d in items)

try:
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    initials = []
    for alpn in (["qxfer/1"], ["h3"]):
        client = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=alpn))
        client.connect(("10.0.0.1", 4433), now=0.0)
        initials.append(client.datagrams_to_send(now=0.0)[0][0])
    write("quic", "initial", bytes([0]) + datagrams([initials[0]]))
    write("quic", "initial-h3", bytes([0]) + datagrams([initials[1], initials[1][:600]]))
except ImportError:
    print("wire_seeds.py: aioquic missing (scripts/install-deps.sh installs it); QUIC Initial seeds skipped", file=sys.stderr)
write("quic", "version-negotiation", bytes([0]) + datagrams([b"\xc0\xba\xba\xba\xba\x08" + bytes(8) + b"\x00" + bytes(1200)]))
write("quic", "short-header", bytes([0]) + datagrams([b"\x40" + bytes(16) + bytes(40)]))
write("quic", "after-xor", bytes([1, 0x00]) + datagrams([b"\x00\x01", b"\x00" * 20 + b"\x01", b"\x80"]))
write("quic", "after-raw", bytes([1, 0xFF]) + datagrams([b"\x40" + bytes(60), b"\xc0\x00\x00\x00\x01" + bytes(40)]))


# session: a script, not wire bytes (fuzz/harness/FuzzSession.swift reads it a byte at a time).
# Byte 0 even: the receiver — algorithm, overwrite, streams, entry count, the entries (kind,
# name, nesting [, which earlier entry] [, size-unknown, size], mtime [, link target]), what is
# on disk already [, its details], then events (0-2 FileData: entry, offset, length-1, source;
# 3-4 FileDone: entry, size, digest, algorithm, source; 5 end; 6 failure; 7 other).
# Byte 0 odd: the sender — algorithm, entries, answer count, answers, then verdicts.
# Numbers: below 128 as they are, from 128 an extreme (140 = 2^63, 143 = 2^64 - 1).
def session_file(name, size, nest=(0,)):
    return bytes([0, name, *nest, 1, size, 0])


write("session", "one-file", bytes([0, 0, 0, 1, 1]) + session_file(0, 5) + bytes([0])
      + bytes([0, 0, 0, 4, 1]) + bytes([3, 0, 0, 0, 0, 1]))
write("session", "tree", bytes([0, 1, 0, 0, 3]) + bytes([1, 2, 0, 0]) + session_file(3, 10, (1, 0))
      + bytes([2, 7, 0, 0, 0]) + bytes([0]) + bytes([0, 1, 0, 9, 0]) + bytes([3, 1, 0, 0, 0, 0]))
write("session", "two-files-of-2to63", bytes([0, 0, 0, 1, 2]) + session_file(0, 140) + session_file(1, 140) + bytes([0]))
write("session", "resume", bytes([0, 0, 0, 1, 1]) + session_file(0, 100) + bytes([4, 40])
      + bytes([0, 0, 0, 47, 1]) + bytes([0, 0, 0, 11, 1]) + bytes([3, 0, 0, 0, 0, 1]))
write("session", "restart-from-0", bytes([0, 0, 0, 0, 1]) + session_file(0, 60) + bytes([4, 40])
      + bytes([0, 0, 200, 0, 39, 0]) + bytes([0, 0, 0, 19, 0]) + bytes([3, 0, 0, 0, 0, 0]))
write("session", "sender", bytes([1, 0, 1]) + session_file(0, 5) + bytes([1, 0, 0]) + bytes([0, 0]) + bytes([0, 2, 1, 0]))
write("session", "sender-hostile-complete", bytes([1, 1, 2]) + session_file(0, 5) + session_file(1, 140) + bytes([1, 0, 0, 2, 5])
      + bytes([0, 0]) + bytes([0, 2, 143, 143]))
