"""WebSocket bench helpers for bench/websocket.sh (issue 37), stdlib only.

  python3 bench/ws_echo.py upstream PORT
      A WebSocket upstream: answers an upgrade with 101 (its
      sec-websocket-accept per RFC 6455), then echoes every byte back as it
      came (client frames are masked; the load client reads them back as
      such), so the upstream costs next to nothing per message.
  python3 bench/ws_echo.py load HOST:PORT PATH CONNS SECS SIZE
      CONNS WebSockets through the proxy at HOST:PORT, each sending a SIZE-byte
      masked text frame and waiting for its echo, again and again for SECS;
      prints `messages=N secs=S`.
"""
import asyncio
import base64
import hashlib
import sys
import time

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


async def serve_conn(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    key = b""
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"sec-websocket-key":
            key = value.strip()
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                 b"connection: Upgrade\r\nsec-websocket-accept: " + accept + b"\r\n\r\n")
    while True:
        data = await reader.read(65536)
        if not data:
            break
        writer.write(data)
        await writer.drain()
    writer.close()


async def upstream(port):
    server = await asyncio.start_server(serve_conn, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def one(host, port, path, size, until, counts):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write((f"GET {path} HTTP/1.1\r\nhost: bench\r\nupgrade: websocket\r\n"
                  "connection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  "sec-websocket-version: 13\r\n\r\n").encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise SystemExit(f"no upgrade: {head[:80]!r}")
    mask = b"\x01\x02\x03\x04"
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(b"x" * size))
    frame = bytes([0x81, 0x80 | size]) + mask + payload
    n = 0
    while time.monotonic() < until:
        writer.write(frame)
        await reader.readexactly(len(frame))
        n += 1
    counts.append(n)
    writer.close()


async def load(target, path, conns, secs, size):
    host, port = target.rsplit(":", 1)
    counts = []
    start = time.monotonic()
    until = start + secs
    await asyncio.gather(*(one(host, int(port), path, size, until, counts) for _ in range(conns)))
    print(f"messages={sum(counts)} secs={time.monotonic() - start:.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "upstream":
        asyncio.run(upstream(int(sys.argv[2])))
    else:
        t, p, c, s, z = sys.argv[2:7]
        assert int(z) < 126, "one-byte payload lengths only"
        asyncio.run(load(t, p, int(c), float(s), int(z)))
