#!/usr/bin/env python3
"""Checks the structure of herd timeline files (HERD_TIMELINE), one per rank of one run.

    check_timeline.py run.rank0.json run.rank1.json ... [--expect-buckets]

Each file must be complete JSON in the trace-event format that Perfetto and chrome://tracing read,
and say what herd promises: a process named after its rank; a named track per communicator and
distributed optimizer; on each communicator's track every operation from its creation (#0; #1 for
one made by split) on, with no sequence number missing, each with its arguments; phases nested inside the operations,
slices nested on every track as Perfetto requires; every asynchronous operation's span closed;
the distributed optimizer's steps (and, with --expect-buckets, its bucket launches, each naming the
sequence number of an operation that is in the file); and the same operations, in the same order
with the same arguments, on every rank.
"""
import decimal
import json
import re
import sys
from collections import defaultdict

OPERATIONS = {"communicator creation", "split", "barrier", "allreduce", "broadcast", "allgather", "allgatherv",
              "reduce_scatter", "grouped allreduce", "alltoall", "alltoallv", "gather", "gatherv", "scatter",
              "scatterv", "reduce", "subset"}
PHASES = {"agreement", "wait to receive", "wait to send", "wait for peers", "reduction", "ring reduce-scatter",
          "ring allgather", "copy in", "copy out", "pack", "unpack"}
OPTIMIZER = {"step", "pack", "unpack", "launch bucket", "wait for buckets", "unpack buckets"}

failures = []


def fail(file, message):
    failures.append(f"{file}: {message}")


def check_nesting(file, track_name, slices):
    """Slices of one track must nest: each starts after and ends before the one that holds it."""
    open_ends = []
    for ev in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        begin, end = ev["ts"], ev["ts"] + ev["dur"]
        while open_ends and open_ends[-1][0] <= begin:
            open_ends.pop()
        if open_ends and end > open_ends[-1][0]:
            fail(file, f"on track '{track_name}', '{ev['name']}' at {begin} overlaps '{open_ends[-1][1]}' without nesting")
            return
        open_ends.append((end, ev["name"]))


def check_file(file):
    with open(file) as f:
        # Complete JSON (the file was closed by timeline::stop() or at exit); times exactly as written.
        events = json.load(f, parse_float=decimal.Decimal)
    if not isinstance(events, list) or not events:
        fail(file, "not a non-empty JSON array of trace events")
        return None
    rank = int(re.search(r"\.rank(\d+)\.json$", file).group(1))
    track_names = {}
    slices = defaultdict(list)
    async_open = {}
    async_closed = 0
    for ev in events:
        for key in ("name", "ph", "pid"):
            if key not in ev:
                fail(file, f"an event lacks '{key}': {ev}")
                return None
        if ev["pid"] != rank:
            fail(file, f"an event of pid {ev['pid']} in rank {rank}'s file")
        ph = ev["ph"]
        if ph == "M":
            if ev["name"] == "thread_name":
                track_names[ev["tid"]] = ev["args"]["name"]
            continue
        if not isinstance(ev.get("ts"), (int, decimal.Decimal)) or "tid" not in ev:
            fail(file, f"an event without a numeric ts or a tid: {ev}")
            continue
        if ph == "X":
            if not isinstance(ev.get("dur"), (int, decimal.Decimal)) or ev["dur"] < 0:
                fail(file, f"a slice without a duration: {ev}")
                continue
            slices[ev["tid"]].append(ev)
        elif ph == "b":
            async_open[ev["id"]] = ev
        elif ph == "e":
            begin = async_open.pop(ev["id"], None)
            if begin is None:
                fail(file, f"an asynchronous end without its begin: {ev}")
            elif ev["ts"] < begin["ts"]:
                fail(file, f"asynchronous '{ev['name']}' ends before it begins")
            else:
                async_closed += 1
    if not any(ev.get("name") == "process_name" and ev["args"]["name"] == f"rank {rank}" for ev in events):
        fail(file, f"no process_name 'rank {rank}'")
    for ev in async_open.values():
        fail(file, f"asynchronous '{ev['name']}' (seq {ev['args'].get('seq')}) never ends")

    communicators = {}  # tid -> [operation slices in seq order]
    optimizer = {}
    for tid, evs in slices.items():
        name = track_names.get(tid)
        if name is None:
            fail(file, f"track {tid} has slices but no name")
            continue
        check_nesting(file, name, evs)
        if name.startswith("communicator #"):
            # A creation runs in parts (the agreement, then finding the node's ranks), each slice #0.
            ops = [e for e in evs if e["name"] in OPERATIONS]
            creations = [e for e in ops if e["name"] == "communicator creation"]
            ops = [e for e in ops if e["name"] != "communicator creation"] + creations[:1]
            for e in evs:
                if e["name"] not in OPERATIONS | PHASES:
                    fail(file, f"unknown slice '{e['name']}' on '{name}'")
            # From the creation (#0; a communicator made by split starts at #1), none missing.
            seqs = [e["args"].get("seq") for e in sorted(ops, key=lambda e: e["ts"])]
            first = seqs[0] if seqs and seqs[0] in (0, 1) else 0
            if seqs != list(range(first, first + len(seqs))):
                missing = sorted(set(range(first, max(seqs) + 1)) - set(seqs)) if seqs else []
                fail(file, f"'{name}': operations are not #{first}..#{first + len(seqs) - 1} in order "
                           f"(missing {missing[:10]})")
            for op in ops:
                args = op["args"]
                if "count" in args and not ("dtype" in args and "bytes" in args):
                    fail(file, f"'{op['name']}' #{args['seq']} has a count but no dtype or bytes")
            # Every phase lies inside an operation.
            spans = [(o["ts"], o["ts"] + o["dur"]) for o in ops + creations]
            for e in evs:
                if e["name"] in PHASES - OPERATIONS and not any(b <= e["ts"] and e["ts"] + e["dur"] <= d for b, d in spans):
                    fail(file, f"phase '{e['name']}' at {e['ts']} on '{name}' lies outside every operation")
                    break
            communicators[tid] = sorted(ops, key=lambda e: e["ts"])
        elif name.startswith("distributed_optimizer"):
            for e in evs:
                if e["name"] not in OPTIMIZER:
                    fail(file, f"unknown slice '{e['name']}' on '{name}'")
            optimizer[tid] = evs
        else:
            fail(file, f"a track named '{name}'")
    if not communicators:
        fail(file, "no communicator track with operations")
        return None
    return {"communicators": communicators, "optimizer": optimizer, "async": async_closed}


def main():
    expect_buckets = "--expect-buckets" in sys.argv
    files = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not files:
        sys.exit("usage: check_timeline.py FILE... [--expect-buckets]")
    summaries = {}
    for file in files:
        summary = check_file(file)
        if summary is None:
            continue
        summaries[file] = summary
        steps = [e for evs in summary["optimizer"].values() for e in evs if e["name"] == "step"]
        if not steps:
            fail(file, "no distributed optimizer steps")
        if expect_buckets:
            launches = [e for evs in summary["optimizer"].values() for e in evs if e["name"] == "launch bucket"]
            seqs = {o["args"]["seq"] for ops in summary["communicators"].values() for o in ops}
            if not launches:
                fail(file, "no bucket launches")
            for launch in launches:
                if launch["args"].get("seq") not in seqs:
                    fail(file, f"bucket {launch['args'].get('bucket')} names operation #{launch['args'].get('seq')}, "
                               "which is not in the file")
                    break
            if summary["async"] == 0:
                fail(file, "no asynchronous operation spans")
    # Every rank ran the same operations on its busiest communicator, with the same arguments.
    def signature(ops):
        return [(o["name"], o["args"].get("seq"), o["args"].get("count"), o["args"].get("dtype")) for o in ops]
    busiest = {f: signature(max(s["communicators"].values(), key=len)) for f, s in summaries.items()}
    reference_file, reference = next(iter(busiest.items()), (None, None))
    for f, sig in busiest.items():
        if sig != reference:
            fail(f, f"its operations differ from {reference_file}'s ({len(sig)} against {len(reference)})")
    for f, s in summaries.items():
        ops = sum(len(v) for v in s["communicators"].values())
        kinds = sorted({o["name"] for v in s["communicators"].values() for o in v})
        print(f"{f}: {ops} operations ({', '.join(kinds)}), {s['async']} asynchronous spans closed")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"timeline structure: OK ({len(files)} files)")


if __name__ == "__main__":
    main()
