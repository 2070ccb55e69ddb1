#!/usr/bin/env python3
"""An aioquic QUIC server that echoes stream data back on the same stream.

Used by Tests/QXferTests/QUICInteropTests.swift to check qxfer's QUIC client against an
independent implementation. Prints `PORT <n>` on its first stdout line once it listens, then one
line `HANDSHAKE alpn=<alpn>` per completed handshake and `ECHOED stream=<id> bytes=<n>` when a
stream's FIN has been echoed. Exits by itself after --lifetime seconds (a safety net: the test
kills it as soon as it is done).
"""
import argparse
import asyncio
import sys

from aioquic.asyncio import QuicConnectionProtocol, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import HandshakeCompleted, StreamDataReceived


def say(line: str) -> None:
    print(line, flush=True)


class EchoProtocol(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._echoed: dict[int, int] = {}

    def quic_event_received(self, event) -> None:
        if isinstance(event, HandshakeCompleted):
            say(f"HANDSHAKE alpn={event.alpn_protocol}")
        elif isinstance(event, StreamDataReceived):
            self._quic.send_stream_data(event.stream_id, event.data, end_stream=event.end_stream)
            total = self._echoed.get(event.stream_id, 0) + len(event.data)
            self._echoed[event.stream_id] = total
            if event.end_stream:
                say(f"ECHOED stream={event.stream_id} bytes={total}")
            self.transmit()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--certificate", required=True)
    parser.add_argument("--private-key", required=True)
    parser.add_argument("--alpn", default="qxfer/1")
    parser.add_argument("--lifetime", type=float, default=60.0)
    args = parser.parse_args()

    configuration = QuicConfiguration(is_client=False, alpn_protocols=[args.alpn])
    configuration.load_cert_chain(args.certificate, args.private_key)
    server = await serve(args.host, args.port, configuration=configuration, create_protocol=EchoProtocol)
    port = server._transport.get_extra_info("sockname")[1]
    say(f"PORT {port}")
    try:
        await asyncio.sleep(args.lifetime)
    finally:
        server.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
