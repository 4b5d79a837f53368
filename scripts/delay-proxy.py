#!/usr/bin/env python3
"""A TCP proxy that delays every chunk it forwards, in both directions: a
server some network away, on loopback. For timing what round trips cost
`dbmutex run` where the connection is not direct (NAT, a Kubernetes
Service, a TCP proxy), which loopback alone hides (BENCHMARKS.md,
session 15). Kernel delay (tc netem) is not on every machine; this is.

    scripts/delay-proxy.py 127.0.0.3:5434 127.0.0.1:5432 0.25 &
    DBMUTEX_TEST_PG_URL=postgres://postgres@127.0.0.3:5434/test \\
        BACKENDS=postgres scripts/cli-overhead.sh 100

Arguments: LISTEN (address:port), TARGET (address:port), DELAY in
milliseconds, added to each direction (asyncio's own scheduling adds more:
measure the round trip with the raw floor, `raw_floor_ms`, in the same run).
Loopback addresses only.
"""
import asyncio
import socket
import sys


def split(hostport):
    host, port = hostport.rsplit(":", 1)
    if not host.startswith("127."):
        sys.exit(f"delay-proxy.py: {host} is not a loopback address")
    return host, int(port)


async def pipe(reader, writer, delay):
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(65536):
            loop.call_later(delay, writer.write, data)
        await asyncio.sleep(2 * delay)
    finally:
        writer.close()


async def main():
    listen, target, delay = split(sys.argv[1]), split(sys.argv[2]), float(sys.argv[3]) / 1000

    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        for w in (client_w, server_w):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(client_r, server_w, delay), pipe(server_r, client_w, delay))

    server = await asyncio.start_server(handle, *listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: delay-proxy.py LISTEN_ADDR:PORT TARGET_ADDR:PORT DELAY_MS")
    asyncio.run(main())
