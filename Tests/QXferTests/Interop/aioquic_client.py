#!/usr/bin/env python3
"""An aioquic QUIC client: handshake with ALPN qxfer/1, send bytes on the first bidirectional
stream, read them back.

Used by Tests/QXferTests/QUICInteropTests.swift against qxfer's QUIC listener. Prints one JSON
line: {"alpn", "stream_id", "sent", "echoed", "intact", "server_fingerprint"} and exits 0 when
the echo came back intact, 1 otherwise (the reason on stderr). Every wait has a time limit.
"""
import argparse
import asyncio
import hashlib
import json
import ssl
import sys

from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration
from cryptography.hazmat.primitives.serialization import Encoding


def fingerprint(certificate) -> str:
    digest = hashlib.sha256(certificate.public_bytes(Encoding.DER)).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


async def run(args) -> int:
    configuration = QuicConfiguration(is_client=True, alpn_protocols=args.alpn.split(","))
    configuration.verify_mode = ssl.CERT_NONE  # qxfer identities are self-signed: pinned below instead
    configuration.server_name = "qxfer"
    if args.certificate:
        configuration.load_cert_chain(args.certificate, args.private_key)
    payload = bytes((i * 2654435761 >> 13) & 0xFF for i in range(args.bytes))

    async with connect(args.host, args.port, configuration=configuration) as client:
        quic = client._quic
        reader, writer = await client.create_stream()
        stream_id = writer.get_extra_info("stream_id")
        writer.write(payload)
        if args.fin:
            writer.write_eof()
        echoed = await asyncio.wait_for(reader.readexactly(len(payload)), timeout=args.timeout)
        peer = quic.tls._peer_certificate
        result = {
            "alpn": quic.tls.alpn_negotiated,
            "stream_id": stream_id,
            "sent": len(payload),
            "echoed": len(echoed),
            "intact": echoed == payload,
            "server_fingerprint": fingerprint(peer) if peer is not None else None,
        }
        print(json.dumps(result), flush=True)
        # The closing period is this client's own timer: three of its probe timeouts (RFC 9000
        # 10.2), which grow with the round trips it measured. On a loaded machine (every suite
        # beside sanitized builds) those reach seconds, so the wait follows the client's estimate.
        closing = 3 * quic._loss.get_probe_timeout()
        client.close()
        try:
            await asyncio.wait_for(client.wait_closed(), timeout=closing + args.timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the closing period ({closing:.1f} s by this client's estimate) "
                               f"had not ended {closing + args.timeout:.1f} s later") from None
        return 0 if result["intact"] else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--bytes", type=int, default=100_000)
    parser.add_argument("--alpn", default="qxfer/1")
    parser.add_argument("--certificate")
    parser.add_argument("--private-key")
    parser.add_argument("--fin", action="store_true", help="finish the stream after sending")
    parser.add_argument("--timeout", type=float, default=15.0)
    args = parser.parse_args()
    try:
        # Each wait above has its own limit; this one only catches a wait without one.
        return asyncio.run(asyncio.wait_for(run(args), timeout=args.timeout * 6))
    except Exception as error:  # one line for the test's failure message
        print(f"aioquic client failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
