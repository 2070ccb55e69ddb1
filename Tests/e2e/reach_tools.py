#!/usr/bin/env python3
"""Helpers of Tests/e2e/reach.sh and bench/reach.sh (standard library only).

    reach_tools.py reflect HOST PORT SECONDS
        A UDP reflector on the public host: answers each datagram with the source "addr:port" it
        came from (what STUN, or the relay's `bound`, tells a client). Stops after SECONDS.
    reach_tools.py punch DIR NAME PEER REFLECTOR_HOST:PORT
        Hole punching between two homes without qxfer, to show what the NATs allow: one UDP
        socket learns its mapped address from the reflector, writes it to DIR/NAME, waits for
        DIR/PEER, then sends to the peer's mapped address every 100 ms for 3 s while listening.
        Prints "open" if a datagram from the peer arrived, else "closed".
    reach_tools.py flood HOST PORT SECONDS [--udp-rate N] [--tcp-rate N]
        A bounded flood of a relay (docs/PROTOCOL.md §9.2-9.4) from another host: bogus UDP
        datagrams (garbage, binds with random tokens, data for nobody), and TCP connections with
        bogus hellos (offers and answers for random rooms, wrong versions, unknown keys, broken
        JSON, a 4 GiB length, a length and then silence, splices with random tokens). At most
        N datagrams and N connections a second (default 2000 and 40; 64 connections held open at
        once), for SECONDS. Prints what it sent as one JSON line.
    reach_tools.py code FILE [TIMEOUT]
        Waits for the sender's code in FILE (its --json event {"event":"code","code":...}, or a
        line "code: N-w-w-w"), prints it; exit 1 if none came within TIMEOUT s (default 60).
    reach_tools.py summary FILE
        The last JSON object in FILE (one per line) that names a path ("path": "direct" or
        "relayed"), printed as one JSON line; exit 1 if there is none.
    reach_tools.py first-data FILE T0
        Milliseconds from T0 (seconds since the epoch, as `date +%s.%N` prints) to the first
        "started" event in FILE (a receiver's --json: it is emitted when a file's first data
        arrives); exit 1 if there is none.
    reach_tools.py wrong-code CODE
        The same nameplate with another last word: a wrong code for the same room.
"""
import json
import os
import random
import re
import socket
import struct
import sys
import time


def reflect(host, port, seconds):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, int(port)))
    end = time.monotonic() + float(seconds)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        sock.settimeout(left)
        try:
            data, source = sock.recvfrom(2048)
        except socket.timeout:
            return
        sock.sendto(f"{source[0]}:{source[1]}".encode(), source)


def punch(directory, name, peer, reflector):
    host, port = reflector.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 0))
    sock.settimeout(0.2)
    mapped = None
    for _ in range(25):
        sock.sendto(b"who", (host, int(port)))
        try:
            data, source = sock.recvfrom(2048)
            if source == (host, int(port)):
                mapped = data.decode()
                break
        except socket.timeout:
            pass
    if mapped is None:
        print("no-reflector")
        return 1
    with open(os.path.join(directory, name + ".tmp"), "w") as handle:
        handle.write(mapped)
    os.rename(os.path.join(directory, name + ".tmp"), os.path.join(directory, name))
    peer_path = os.path.join(directory, peer)
    deadline = time.monotonic() + 10
    while not os.path.exists(peer_path):
        if time.monotonic() > deadline:
            print("no-peer")
            return 1
        time.sleep(0.05)
    peer_host, peer_port = open(peer_path).read().rsplit(":", 1)
    target = (peer_host, int(peer_port))
    opened = False
    end = time.monotonic() + 3
    sock.settimeout(0.1)
    while time.monotonic() < end:
        sock.sendto(b"punch " + name.encode(), target)
        try:
            data, source = sock.recvfrom(2048)
            if data == b"punch " + peer.encode():
                opened = True
        except socket.timeout:
            pass
    print("open" if opened else "closed")
    return 0


def frame(obj_or_bytes):
    body = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
    return struct.pack(">I", len(body)) + body


def random_room():
    return os.urandom(32).hex()


def bogus_stream_openings():
    """What each bogus TCP connection sends first (the relay reads a hello within 10 s)."""
    token = lambda: __import__("base64").b64encode(os.urandom(16)).decode()
    return [
        ("offer-random-room", frame({"hello": {"version": 1, "room": random_room(), "side": "offer"}})),
        ("answer-random-room", frame({"hello": {"version": 1, "room": random_room(), "side": "answer"}})),
        ("wrong-version", frame({"hello": {"version": 99, "room": random_room(), "side": "offer"}})),
        ("unknown-key", frame({"hello": {"version": 1, "room": random_room(), "side": "offer", "x": 1}})),
        ("bad-room", frame({"hello": {"version": 1, "room": "zz" * 40, "side": "offer"}})),
        ("broken-json", frame(b"{\"hello\": {\"version\": 1, \"ro")),
        ("signal-first", frame({"signal": {"data": "AAAA"}})),
        ("huge-length", struct.pack(">I", 0xFFFFFFFF) + b"x" * 100),
        ("length-then-silence", struct.pack(">I", 4000) + b"{"),
        ("splice-random-token", frame({"splice": {"bindToken": token(), "id": random.randrange(65536)}})),
        ("garbage", os.urandom(random.randrange(1, 600))),
    ]


def bogus_datagram():
    kind = random.randrange(5)
    if kind == 0:
        return "bind-random-token", b"\x01" + os.urandom(16)
    if kind == 1:
        return "data-for-nobody", b"\x03" + os.urandom(random.randrange(0, 1400))
    if kind == 2:
        return "bound-spoof", b"\x02\x04" + os.urandom(6)
    if kind == 3:
        return "punch-like", b"\x10" + os.urandom(24)
    return "garbage", os.urandom(random.randrange(0, 1400))


def flood(host, port, seconds, udp_rate=2000, tcp_rate=40):
    port = int(port)
    end = time.monotonic() + float(seconds)
    counts = {}
    udp_sockets = []
    for _ in range(16):  # 16 source ports, as many "clients"
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setblocking(False)
        udp_sockets.append(s)
    held = []  # TCP connections kept open (slow or silent clients), at most 64
    start = time.monotonic()
    sent_udp = sent_tcp = 0
    refused = 0
    while time.monotonic() < end:
        elapsed = time.monotonic() - start
        while sent_udp < elapsed * udp_rate:
            name, payload = bogus_datagram()
            try:
                random.choice(udp_sockets).sendto(payload, (host, port))
                counts["udp:" + name] = counts.get("udp:" + name, 0) + 1
            except (BlockingIOError, OSError):
                counts["udp:not-sent"] = counts.get("udp:not-sent", 0) + 1
            sent_udp += 1
        while sent_tcp < elapsed * tcp_rate:
            sent_tcp += 1
            name, opening = random.choice(bogus_stream_openings())
            try:
                conn = socket.create_connection((host, port), timeout=1)
                conn.setblocking(False)
                try:
                    conn.send(opening)
                except (BlockingIOError, OSError):
                    pass
                counts["tcp:" + name] = counts.get("tcp:" + name, 0) + 1
                held.append(conn)
            except OSError:
                refused += 1
            while len(held) > 64:
                held.pop(0).close()
        # Read and drop whatever the relay answers, so its writes do not block on us.
        for conn in list(held):
            try:
                if conn.recv(4096) == b"":
                    held.remove(conn)
                    conn.close()
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                held.remove(conn)
                conn.close()
        for s in udp_sockets:
            try:
                while s.recv(2048):
                    pass
            except (BlockingIOError, OSError):
                pass
        time.sleep(0.005)
    for conn in held:
        conn.close()
    counts["tcp:refused"] = refused
    print(json.dumps({"datagrams": sent_udp, "connections": sent_tcp, "kinds": counts}, sort_keys=True))


CODE_TEXT = re.compile(r"code:\s*([0-9]{1,4}(?:-[a-z]+){3})")


def find_code(path, timeout=60):
    end = time.monotonic() + float(timeout)
    while time.monotonic() < end:
        try:
            text = open(path, errors="replace").read()
        except FileNotFoundError:
            text = ""
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "code" and isinstance(event.get("code"), str):
                    print(event["code"])
                    return 0
            match = CODE_TEXT.search(line)
            if match:
                print(match.group(1))
                return 0
        time.sleep(0.05)
    return 1


def events(path):
    for line in open(path, errors="replace"):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def summary(path):
    """The summary event if it names the path, else the last event that does (other events use
    "path" for a file's name: only the two values count)."""
    found = None
    for event in events(path):
        if event.get("path") in ("direct", "relayed") and (found is None or found.get("event") != "summary" or event.get("event") == "summary"):
            found = event
    if found is None:
        return 1
    print(json.dumps(found, sort_keys=True))
    return 0


def first_data(path, t0):
    import datetime
    for event in events(path):
        if event.get("event") == "started" and isinstance(event.get("time"), str):
            moment = datetime.datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
            print(round((moment.timestamp() - float(t0)) * 1000))
            return 0
    return 1


def wrong_code(code):
    parts = code.split("-")
    parts[-1] = "apple" if parts[-1] != "apple" else "acorn"
    print("-".join(parts))


def main(argv):
    command, args = argv[1], argv[2:]
    if command == "reflect":
        reflect(*args)
    elif command == "punch":
        return punch(*args)
    elif command == "flood":
        options = {"udp_rate": 2000, "tcp_rate": 40}
        positional = []
        i = 0
        while i < len(args):
            if args[i] in ("--udp-rate", "--tcp-rate"):
                options[args[i][2:].replace("-", "_")] = float(args[i + 1])
                i += 2
            else:
                positional.append(args[i])
                i += 1
        flood(*positional, **options)
    elif command == "code":
        return find_code(*args)
    elif command == "summary":
        return summary(*args)
    elif command == "first-data":
        return first_data(*args)
    elif command == "wrong-code":
        wrong_code(*args)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
