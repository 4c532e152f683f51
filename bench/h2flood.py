#!/usr/bin/env python3
"""An h2c flood for bench/flood.sh: CONNS connections at once, each sending
STREAMS requests (prior knowledge, HPACK literals without indexing) in batches,
every other batch with 150 header fields (the agent answers 431) and the others
with 90 (forwarded), and a RST_STREAM (CANCEL) right after every other request
(rapid reset). Reads and discards whatever the server sends. Bounded: every
connection sends its streams and closes; the whole run stops after TIMEOUT s.

    python3 bench/h2flood.py HOST PORT [CONNS] [STREAMS]
"""
import asyncio
import struct
import sys

HOST, PORT = sys.argv[1], int(sys.argv[2])
CONNS = int(sys.argv[3]) if len(sys.argv) > 3 else 200
STREAMS = int(sys.argv[4]) if len(sys.argv) > 4 else 300
BATCH = 50
TIMEOUT = 120


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def lit(name_index, value):
    # Literal header field without indexing, indexed name (RFC 7541 6.2.2).
    return bytes([name_index]) + bytes([len(value)]) + value


def new_lit(name, value):
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def block(fields):
    head = b"\x82\x86" + lit(4, b"/api/flood") + lit(1, b"x")
    return head + b"".join(new_lit(b"x-flood-%03d" % i, b"v" * 24) for i in range(fields))


BIG, SMALL = block(150), block(90)


async def drain(reader):
    try:
        while await reader.read(65536):
            pass
    except (ConnectionError, OSError):
        pass


async def one(n):
    try:
        reader, writer = await asyncio.open_connection(HOST, PORT)
    except OSError:
        return 0
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
    # The server's SETTINGS first, then our ACK.
    try:
        head = await asyncio.wait_for(reader.readexactly(9), 10)
        await reader.readexactly(int.from_bytes(head[:3], "big"))
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError):
        writer.close()
        return 0
    writer.write(frame(4, 1, 0, b""))
    reading = asyncio.create_task(drain(reader))
    sent = 0
    stream = 1
    try:
        for b in range(0, STREAMS, BATCH):
            out = []
            fields = BIG if (b // BATCH + n) % 2 else SMALL
            for i in range(BATCH):
                out.append(frame(1, 0x5, stream, fields))
                if i % 2:
                    out.append(frame(3, 0, stream, struct.pack(">I", 8)))
                stream += 2
                sent += 1
            writer.write(b"".join(out))
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    try:
        writer.write(frame(7, 0, 0, struct.pack(">II", stream - 2, 0)))  # GOAWAY
        await writer.drain()
        writer.close()
    except (ConnectionError, OSError):
        pass
    reading.cancel()
    return sent


async def main():
    sent = await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(CONNS))), TIMEOUT)
    print(f"h2flood: {sum(sent)} streams on {CONNS} connections")


asyncio.run(main())
