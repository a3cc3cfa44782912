#!/usr/bin/env python3
"""The link between two simulated nodes, measured with plain TCP: the limit beside herd's numbers.

Launched by mpiexec as two processes, one on each node (tests/multinode/nodes.sh --layout 1,1), it
needs no MPI library: the rank comes from the launcher's environment (OMPI_COMM_WORLD_RANK or
PMI_RANK). Rank 0 listens on node0's address, rank 1 connects, and they measure:
  rtt       the round trip of one byte, median of 2000
  one_way   GB/s of 512 MiB sent from rank 1 to rank 0 in 4 MiB writes
  duplex    GB/s each way while both send 512 MiB at once (what two leaders' ring exchange needs)
Rank 0 prints one line: "link: rtt_us=... one_way_GBps=... duplex_GBps=...".
"""

import os
import socket
import statistics
import sys
import threading
import time

ADDRESS = os.environ.get("HERD_LINK_PROBE_ADDRESS", "10.213.0.1")  # node0 in nodes.sh
PORT = int(os.environ.get("HERD_LINK_PROBE_PORT", "47211"))
CHUNK = 4 << 20
TOTAL = 512 << 20


def rank():
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    sys.exit("link_probe: run it under mpiexec (no rank in the environment)")


def receive_exactly(conn, n, buffer):
    view = memoryview(buffer)
    got = 0
    while got < n:
        k = conn.recv_into(view[: min(len(buffer), n - got)])
        if k == 0:
            raise ConnectionError("the peer closed the connection")
        got += k


def send_all(conn, n, buffer):
    sent = 0
    while sent < n:
        k = min(len(buffer), n - sent)
        conn.sendall(memoryview(buffer)[:k])
        sent += k


def connect():
    if rank() == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((ADDRESS, PORT))
        server.listen(1)
        conn, _ = server.accept()
        server.close()
    else:
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = socket.create_connection((ADDRESS, PORT), timeout=20)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def main():
    me = rank()
    conn = connect()
    buffer = bytearray(CHUNK)
    one = bytearray(1)
    # Round trips of one byte.
    times = []
    for _ in range(2000):
        if me == 0:
            start = time.perf_counter()
            conn.sendall(one)
            receive_exactly(conn, 1, one)
            times.append(time.perf_counter() - start)
        else:
            receive_exactly(conn, 1, one)
            conn.sendall(one)
    # One way: rank 1 sends; rank 0 times from the first byte to the last (and acknowledges).
    if me == 0:
        receive_exactly(conn, 1, one)
        start = time.perf_counter()
        receive_exactly(conn, TOTAL, buffer)
        one_way = TOTAL / (time.perf_counter() - start) / 1e9
        conn.sendall(one)
    else:
        conn.sendall(one)
        send_all(conn, TOTAL, buffer)
        receive_exactly(conn, 1, one)
    # Both ways at once.
    other = bytearray(CHUNK)
    conn.sendall(one)
    receive_exactly(conn, 1, one)
    start = time.perf_counter()
    sender = threading.Thread(target=send_all, args=(conn, TOTAL, other))
    sender.start()
    receive_exactly(conn, TOTAL, buffer)
    sender.join()
    duplex = TOTAL / (time.perf_counter() - start) / 1e9
    if me == 0:
        print(f"link: rtt_us={statistics.median(times) * 1e6:.1f} one_way_GBps={one_way:.3f} duplex_GBps={duplex:.3f}",
              flush=True)
    conn.close()


if __name__ == "__main__":
    main()
