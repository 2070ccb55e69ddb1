#!/usr/bin/env python3
"""Hostile peers against a running `qxfer recv` (driven by Tests/e2e/hostile.sh).

Written from docs/PROTOCOL.md alone, with Python's ssl module for TCP+TLS and aioquic for QUIC,
so it is also an independent encoder of qxfer/1 Offers. Checks, on the stack given:
  * every Offer of the path-traversal corpus is answered with Decline (unsafe-path) or Error
    (malformed / limit-exceeded, where the structure itself is broken) and nothing is written:
    the target folder stays empty and its parent keeps exactly its entries;
  * hostile numbers: an Offer of two files of 2^63 bytes (their sum overflows 64 bits) gets
    Decline(limit-exceeded), and a frame header announcing 16 MiB + 1 bytes gets
    Error(limit-exceeded) — on QUIC followed by a close with application error code 2;
  * TCP+TLS only: a TLS 1.2-only client fails its handshake;
  * a client offering ALPN h2 (TLS) or h3 (QUIC) is refused: no handshake, or a connection the
    receiver closes without answering an Offer;
  * an Error whose words carry terminal escapes, a line break and a bidirectional override, sent
    after an accepted Offer (hostile.sh checks that the receiver showed them harmless);
  * not hostile: a sparse file sent with the `zeros` flag (FileData, Zeros, FileData, FileDone
    with SHA-256, §3.8) is Verified, arrives identical and takes less space than its size.
Prints one line per check; exits 1 on the first failure.

    hostile_peer.py --stack tls|quic --port P --target DIR
    hostile_peer.py --stack tls|quic --port P --connect-only

With --connect-only it only completes handshakes and goes away before any message, as the loser
of a sender's stack race does once both handshakes have completed, and as a port probe does:
over TLS once with close_notify and once with a TCP reset, over QUIC with CONNECTION_CLOSE.
"""
import argparse
import asyncio
import hashlib
import os
import socket
import ssl
import struct
import sys

UNSAFE_PATH, MALFORMED, LIMIT_EXCEEDED = 3, 1, 2


def frame(kind, body):
    return struct.pack(">II", kind, len(body)) + body


def str16(data):
    return struct.pack(">H", len(data)) + data


def entry(components, kind=0, target=b"", size=0):
    return (struct.pack(">BBH", kind, 0, len(components)) + b"".join(str16(c) for c in components)
            + struct.pack(">QIq", size, 0o644, 0) + str16(target))


def offer(*entries):
    return frame(1, struct.pack(">BBI", 1, 0, len(entries)) + b"".join(entries))


FILE, DIRECTORY, SYMLINK = 0, 1, 2
CORPUS = [
    ("dot-dot", offer(entry([b".."]))),
    ("dot", offer(entry([b"."]))),
    ("climb under a folder", offer(entry([b"a"], DIRECTORY), entry([b"a", b".."]))),
    ("climb then name", offer(entry([b"..", b"escaped"]))),
    ("slash inside a component", offer(entry([b"../escaped"]))),
    ("absolute path", offer(entry([b"/tmp/qxfer-escaped"]))),
    ("empty component", offer(entry([b""]))),
    ("NUL", offer(entry([b"a\x00b"]))),
    ("terminal escape", offer(entry([b"evil\x1b[2J"]))),
    ("DEL", offer(entry([b"x\x7f"]))),
    ("256-byte name", offer(entry([b"n" * 256]))),
    ("65 levels", offer(entry([b"d"] * 65))),
    ("reserved partial suffix", offer(entry([b"f.qxfer-partial"]))),
    ("reserved journal suffix", offer(entry([b"f.qxfer-journal"]))),
    ("duplicate names", offer(entry([b"same"]), entry([b"same"]))),
    ("entry under a file", offer(entry([b"f"]), entry([b"f", b"g"]))),
    ("entry under a symlink", offer(entry([b"l"], SYMLINK, b"."), entry([b"l", b"x"]))),
    ("symlink climbing out", offer(entry([b"l"], SYMLINK, b"../escaped"))),
    ("absolute symlink", offer(entry([b"l"], SYMLINK, b"/etc"))),
    ("symlink dot-dot after a name", offer(entry([b"d"], DIRECTORY), entry([b"d", b"l"], SYMLINK, b"x/../../escaped"))),
    ("symlink climbing through a combining mark", offer(entry([b"l"], SYMLINK, "../\u0301x".encode()))),
    ("count past the bytes sent", frame(1, struct.pack(">BBI", 1, 0, 1_000_000) + entry([b"a"]))),
    ("depth past the bytes sent", frame(1, struct.pack(">BBIBBH", 1, 0, 1, 0, 0, 64) + str16(b"a"))),
]
EXPECTED_CODES = {UNSAFE_PATH, MALFORMED, LIMIT_EXCEEDED}


def fail(message):
    print(f"hostile_peer: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def ok(message):
    print(f"hostile_peer: ok: {message}")


def parse_decline(reply, name):
    if len(reply) < 8:
        fail(f"{name}: the connection ended without an answer ({len(reply)} bytes)")
    kind, length = struct.unpack(">II", reply[:8])
    body = reply[8:8 + length]
    if kind not in (3, 9) or len(body) < 4:
        fail(f"{name}: answered with message type {kind}, not Decline or Error")
    code = struct.unpack(">H", body[:2])[0]
    if code not in EXPECTED_CODES:
        fail(f"{name}: declined with code {code}, expected one of {sorted(EXPECTED_CODES)}")
    message = body[4:4 + struct.unpack(">H", body[2:4])[0]].decode(errors="replace")
    return code, message


def tls_context(alpn=("qxfer/1",), maximum=None):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if maximum:
        context.maximum_version = maximum
    else:
        context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(list(alpn))
    return context


def read_reply(sock, timeout=10):
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) >= 8 and len(data) >= 8 + struct.unpack(">I", data[4:8])[0]:
                break
    except (ssl.SSLError, ConnectionError, socket.timeout):
        pass
    return data


def tls_exchange(port, message, then=None, **context_options):
    """Sends `message`, reads the reply; then sends `then`, if given, and reads until the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with tls_context(**context_options).wrap_socket(raw, server_hostname="qxfer") as sock:
            sock.sendall(message)
            reply = read_reply(sock)
            if then is not None:
                sock.sendall(then)
                read_reply(sock, timeout=5)
            return reply, sock.selected_alpn_protocol()


async def quic_exchange(port, message, alpn=("qxfer/1",), close_code=None, then=None):
    from aioquic.asyncio import connect
    from aioquic.quic.configuration import QuicConfiguration

    configuration = QuicConfiguration(is_client=True, alpn_protocols=list(alpn), verify_mode=ssl.CERT_NONE)
    async with connect("127.0.0.1", port, configuration=configuration, wait_connected=True) as client:
        reader, writer = await client.create_stream()
        writer.write(message)
        data = b""
        try:
            while len(data) < 8 or len(data) < 8 + struct.unpack(">I", data[4:8])[0]:
                chunk = await asyncio.wait_for(reader.read(65536), 10)
                if not chunk:
                    break
                data += chunk
        except (asyncio.TimeoutError, ConnectionError):
            pass
        if then is not None:
            writer.write(then)
            await asyncio.sleep(0.5)
        if close_code is not None:
            # The receiver closes after its Error: record the application error code it used.
            try:
                await asyncio.wait_for(client.wait_closed(), 10)
            except asyncio.TimeoutError:
                pass
            event = getattr(client._quic, "_close_event", None)
            close_code.append(None if event is None else event.error_code)
        return data


def exchange(stack, port, message, then=None):
    if stack == "tls":
        return tls_exchange(port, message, then=then)[0]
    return asyncio.run(asyncio.wait_for(quic_exchange(port, message, then=then), 30))


def check_numbers(stack, port, target):
    """The two hostile-number cases of issue 17: an overflowing sum of sizes, an oversized frame."""
    huge = offer(entry([b"a"], size=1 << 63), entry([b"b"], size=1 << 63))
    reply = exchange(stack, port, huge)
    if len(reply) < 10 or struct.unpack(">I", reply[:4])[0] != 3:
        fail(f"two files of 2^63 bytes: expected Decline, got {reply[:16]!r}")
    code = struct.unpack(">H", reply[8:10])[0]
    if code != LIMIT_EXCEEDED:
        fail(f"two files of 2^63 bytes: declined with code {code}, expected {LIMIT_EXCEEDED}")
    ok(f"{stack}: an offer of two files of 2^63 bytes is declined with limit-exceeded")

    oversized = struct.pack(">II", 1, 16 * 1024 * 1024 + 1) + b"\0" * 64
    close_code = []
    if stack == "tls":
        reply = tls_exchange(port, oversized)[0]
    else:
        reply = asyncio.run(asyncio.wait_for(quic_exchange(port, oversized, close_code=close_code), 30))
    if len(reply) < 10 or struct.unpack(">I", reply[:4])[0] != 9 or struct.unpack(">H", reply[8:10])[0] != LIMIT_EXCEEDED:
        fail(f"a 16 MiB + 1 frame: expected Error(limit-exceeded), got {reply[:16]!r}")
    if stack == "quic" and close_code != [LIMIT_EXCEEDED]:
        fail(f"a 16 MiB + 1 frame: QUIC closed with application error code {close_code}, expected {LIMIT_EXCEEDED}")
    ok(f"{stack}: a frame of 16 MiB + 1 bytes gets Error(limit-exceeded)"
       + (" and QUIC close code 2" if stack == "quic" else ""))
    if os.listdir(target):
        fail(f"the hostile numbers left something: {os.listdir(target)}")


FORGED = b"evil\x1b]0;pwned\x07\x1b[2J\r\nqxfer: forged line \xe2\x80\xae"


def check_words(stack, port):
    """A sender's Error carrying terminal escapes, a line break and a bidirectional override,
    after its Offer was accepted: the receiver must show it harmless (hostile.sh reads its
    standard error) and stay up."""
    offer_one = offer(entry([b"words.txt"], size=5))
    error = frame(9, struct.pack(">H", 1) + str16(FORGED))
    reply = exchange(stack, port, offer_one, then=error)
    if len(reply) < 8 or struct.unpack(">I", reply[:4])[0] != 2:
        fail(f"an offer of one file: expected Accept, got {reply[:16]!r}")
    ok(f"{stack}: an Error with terminal escapes sent after Accept")


SHA256, ZEROS_FLAG = 2, 4


def read_until_complete(chunks):
    """Frames from an iterator of received byte chunks, up to Complete (type 8); their types."""
    data, types = b"", []
    for chunk in chunks:
        data += chunk
        while len(data) >= 8 and len(data) >= 8 + struct.unpack(">I", data[4:8])[0]:
            kind, length = struct.unpack(">II", data[:8])
            types.append(kind)
            data = data[8 + length:]
            if kind in (8, 9):
                return types
    return types


def check_zeros(stack, port, target):
    """An independent sender of a sparse file: its hole as one Zeros message (§3.8)."""
    head, tail, hole = b"the head of a disk image", b"and its tail", 3 * 1024 * 1024 + 5
    content = head + b"\0" * hole + tail
    sent_offer = frame(1, struct.pack(">BBI", SHA256, ZEROS_FLAG, 1) + entry([b"sparse.img"], size=len(content)))
    data = (frame(4, struct.pack(">IQ", 0, 0) + head)
            + frame(11, struct.pack(">IQQ", 0, len(head), hole))
            + frame(4, struct.pack(">IQ", 0, len(head) + hole) + tail)
            + frame(5, struct.pack(">IQBB", 0, len(content), SHA256, 32) + hashlib.sha256(content).digest()))
    if stack == "tls":
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with tls_context().wrap_socket(raw, server_hostname="qxfer") as sock:
                sock.sendall(sent_offer)
                accept = read_reply(sock)
                sock.sendall(data)
                sock.settimeout(10)
                types = read_until_complete(iter(lambda: sock.recv(65536), b""))
    else:
        async def run():
            from aioquic.asyncio import connect
            from aioquic.quic.configuration import QuicConfiguration
            configuration = QuicConfiguration(is_client=True, alpn_protocols=["qxfer/1"], verify_mode=ssl.CERT_NONE)
            async with connect("127.0.0.1", port, configuration=configuration, wait_connected=True) as client:
                reader, writer = await client.create_stream()
                writer.write(sent_offer)
                accept = await asyncio.wait_for(reader.read(65536), 10)
                _, data_writer = await client.create_stream()  # the file's own data stream (§1)
                data_writer.write(data)
                data_writer.write_eof()
                received = []
                while 8 not in read_until_complete(received) and 9 not in read_until_complete(received):
                    chunk = await asyncio.wait_for(reader.read(65536), 10)
                    if not chunk:
                        break
                    received.append(chunk)
                return accept, read_until_complete(received)
        accept, types = asyncio.run(asyncio.wait_for(run(), 30))
    if len(accept) < 8 or struct.unpack(">I", accept[:4])[0] != 2:
        fail(f"a sparse file: expected Accept, got {accept[:16]!r}")
    if 6 not in types or types[-1:] != [8]:
        fail(f"a sparse file: expected Verified and Complete, got message types {types}")
    path = os.path.join(target, "sparse.img")
    with open(path, "rb") as received:
        if received.read() != content:
            fail("a sparse file: it arrived different")
    allocated = os.stat(path).st_blocks * 512
    if allocated >= len(content) // 2:
        fail(f"a sparse file of {len(content)} bytes takes {allocated} on the receiver")
    os.remove(path)
    ok(f"{stack}: a sparse file sent with a Zeros message is verified and takes {allocated} bytes for {len(content)}")


def connect_only(stack, port):
    """Completes handshakes and leaves before any message (see the module's docstring)."""
    if stack == "tls":
        for abrupt in (False, True):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                sock = tls_context().wrap_socket(raw, server_hostname="qxfer")
                if sock.selected_alpn_protocol() != "qxfer/1":
                    fail("tls: the handshake did not select qxfer/1")
                if abrupt:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.close()
                else:
                    try:
                        sock.unwrap()  # close_notify; the receiver's answer may follow its session tickets
                    except ssl.SSLError:
                        pass
                    sock.close()
        ok("tls: two handshakes completed and left before an offer (close_notify, reset)")
        return

    async def run():
        from aioquic.asyncio import connect
        from aioquic.quic.configuration import QuicConfiguration

        configuration = QuicConfiguration(is_client=True, alpn_protocols=["qxfer/1"], verify_mode=ssl.CERT_NONE)
        async with connect("127.0.0.1", port, configuration=configuration, wait_connected=True) as client:
            client.close()
            await client.wait_closed()
    asyncio.run(asyncio.wait_for(run(), 30))
    ok("quic: a handshake completed and left before an offer (CONNECTION_CLOSE)")


def snapshot(target):
    parent = os.path.dirname(os.path.abspath(target))
    return sorted(os.listdir(parent)), sorted(os.listdir(target))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stack", choices=["tls", "quic"], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target")
    parser.add_argument("--connect-only", action="store_true")
    args = parser.parse_args()
    if args.connect_only:
        connect_only(args.stack, args.port)
        return
    if not args.target:
        parser.error("--target is needed")

    before = snapshot(args.target)
    if before[1]:
        fail(f"the target folder is not empty to begin with: {before[1]}")
    codes = {}
    for name, message in CORPUS:
        code, text = parse_decline(exchange(args.stack, args.port, message), name)
        codes[code] = codes.get(code, 0) + 1
        if "\n" in text:
            fail(f"{name}: a multi-line refusal")
        after = snapshot(args.target)
        if after != before:
            fail(f"{name}: something was written: parent {after[0]}, target {after[1]}")
    ok(f"{args.stack}: {len(CORPUS)} hostile offers declined (codes {dict(sorted(codes.items()))}), nothing written")
    check_numbers(args.stack, args.port, args.target)
    check_words(args.stack, args.port)
    check_zeros(args.stack, args.port, args.target)

    probe = offer(entry([b"probe.txt"], size=5))
    if args.stack == "tls":
        try:
            reply, _ = tls_exchange(args.port, probe, maximum=ssl.TLSVersion.TLSv1_2)
            fail(f"a TLS 1.2-only client completed a handshake (answer: {reply[:16]!r})")
        except (ssl.SSLError, ConnectionError):
            ok("tls: a TLS 1.2-only client is refused in the handshake")
        try:
            reply, selected = tls_exchange(args.port, probe, alpn=("h2",))
            if reply or selected:
                fail(f"a client offering only h2 got ALPN {selected!r} and answer {reply[:16]!r}")
            ok("tls: a client offering only h2 is closed without an answer")
        except (ssl.SSLError, ConnectionError):
            ok("tls: a client offering only h2 is refused in the handshake")
    else:
        try:
            reply = asyncio.run(asyncio.wait_for(quic_exchange(args.port, probe, alpn=("h3",)), 15))
            if reply:
                fail(f"a QUIC client offering only h3 got an answer {reply[:16]!r}")
            ok("quic: a client offering only h3 is closed without an answer")
        except (ConnectionError, asyncio.TimeoutError):
            ok("quic: a client offering only h3 is refused in the handshake")
    if snapshot(args.target) != before:
        fail("the refused clients left something behind")


if __name__ == "__main__":
    main()
