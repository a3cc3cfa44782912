#!/usr/bin/python3
"""The allreduce that PyTorch users know, timed as benchmarks/allreduce times herd's: torch.distributed with
the gloo backend, f32 sum in place, sizes doubling from --min-bytes to --max-bytes.

One process per rank; benchmarks/gloo_allreduce.sh N starts them (Debian's torchrun does not work):

  benchmarks/gloo_allreduce.sh 2 [--min-bytes 8] [--max-bytes 268435456] [--reps 9]
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=r WORLD_SIZE=2 /usr/bin/python3 benchmarks/gloo_allreduce.py

Per size, as in allreduce.cpp: the buffer is filled with values that every order of summation adds up
exactly and the reduced values are checked against the expected sums; then a warm-up, then --reps
repetitions of k calls back to back between barriers (k = 64 MiB / size, clamped to 1..200), each
repetition's time per call being the slowest rank's. The table shows the median over the repetitions;
busbw = algbw * 2(n-1)/n. Rank 0 prints it in allreduce.cpp's layout ('#' header, '|' between groups),
which benchmarks/plot.py reads.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

ELEMENT_BYTES = 4  # f32


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args()
    if args.min_bytes < 1 or args.max_bytes < args.min_bytes:
        p.error(f"need 1 <= --min-bytes <= --max-bytes, got {args.min_bytes} and {args.max_bytes}")
    args.reps = max(1, args.reps)
    return args


def pattern(count, rank):
    """allreduce.cpp's fill: element i holds (i + rank) % 3 - 1."""
    period = torch.tensor([float((k + rank) % 3 - 1) for k in range(3)], dtype=torch.float32)
    return period.repeat((count + 2) // 3)[:count]


def time_calls(call, nbytes, reps):
    """Median over repetitions of the slowest rank's time per call, in seconds."""
    per_rep = min(max((64 << 20) // max(nbytes, 1), 1), 200)
    for _ in range(min(per_rep, 5)):
        call()
    samples = []
    slowest = torch.zeros(1, dtype=torch.float64)
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(per_rep):
            call()
        slowest[0] = (time.perf_counter() - start) / per_rep
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        samples.append(slowest.item())
    return statistics.median_high(samples)


def main():
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=5))

    max_count = max(args.max_bytes // ELEMENT_BYTES, 1)
    mine = pattern(max_count, rank)
    expected = sum(pattern(max_count, r) for r in range(world))
    buffer = torch.empty(max_count, dtype=torch.float32)
    bus_factor = 2.0 * (world - 1) / world if world > 1 else 1.0
    if rank == 0:
        print(f"# gloo allreduce (torch.distributed {torch.__version__}): {world} rank{'s' if world > 1 else ''}, "
              f"f32 sum, in place, medians of {args.reps} repetitions")
        print(f"# {'bytes':>12} | {'gloo us':>10} {'busbw':>9}")
        print(f"# {'':>12} | {'':>10} {'GB/s':>9}", flush=True)

    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        count = max(nbytes // ELEMENT_BYTES, 1)
        real_bytes = count * ELEMENT_BYTES
        view = buffer[:count]
        view.copy_(mine[:count])
        dist.all_reduce(view)
        wrong = torch.tensor([0 if torch.equal(view, expected[:count]) else 1])
        if wrong.item():
            bad = int((view != expected[:count]).nonzero()[0])
            print(f"gloo_allreduce (rank {rank}): wrong sum at {real_bytes} bytes, element {bad}: got "
                  f"{view[bad].item()}, expected {expected[bad].item()}", file=sys.stderr, flush=True)
        # Every rank stops at the first size where any rank's sums are wrong, none left waiting in gloo.
        dist.all_reduce(wrong, op=dist.ReduceOp.MAX)
        if wrong.item():
            dist.destroy_process_group()
            return 1

        seconds = time_calls(lambda: dist.all_reduce(view), real_bytes, args.reps)
        if rank == 0:
            gb = real_bytes / 1e9
            print(f"  {real_bytes:>12} | {seconds * 1e6:>10.2f} {gb / seconds * bus_factor:>9.3f}", flush=True)
        nbytes *= 2
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
