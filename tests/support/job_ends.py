#!/usr/bin/env python3
"""Runs an MPI job and checks, from outside it, that every one of its processes is gone in time.

    job_ends.py --token TOKEN --begin TEXT --bound SECONDS -- mpiexec ... program ... TOKEN

The job's output is read line by line as it comes, each line timed; the clock starts at the first
line containing TEXT (the fault's start, printed by the job). Then the launcher's exit is awaited,
and /proc is watched until no process whose command line holds TOKEN is left (launchers, their
helpers and the ranks). Prints the times and exits 0 when the last process went within SECONDS of
TEXT, 1 otherwise (or if TEXT never came); any process still there at the end is killed, the
launcher's session first.

With --program NAME (repeatable), the bound is for the processes whose executable is named NAME
(the ranks' program and mpiexec, say) and holding TOKEN: a harness around the launcher (the
simulated nodes of tests/multinode, which tear down after the job) is then waited for, within the
limit, and its end printed, but not bounded.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time


def ancestors():
    """This process and those above it (a wrapper's command line may hold the token too)."""
    pids = set()
    pid = os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            break
    return pids


def processes_with(token, programs=None):
    found = []
    mine = ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and token.encode() in words:
            if programs and os.path.basename(words[0].decode(errors="replace")) not in programs:
                continue
            found.append(int(entry))
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--token", required=True)
    parser.add_argument("--begin", required=True)
    parser.add_argument("--bound", type=float, required=True)
    parser.add_argument("--limit", type=float, default=60)
    parser.add_argument("--program", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command and args.command[0] == "--" else args.command

    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    begun = []
    lines = []

    def read():
        for raw in job.stdout:
            now = time.monotonic()
            line = raw.decode(errors="replace").rstrip("\n")
            lines.append((now, line))
            if not begun and args.begin in line:
                begun.append(now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.monotonic()
    launcher_gone = None
    last_gone = None
    programs_gone = None
    while time.monotonic() - start < args.limit:
        if launcher_gone is None and job.poll() is not None:
            launcher_gone = time.monotonic()
        if args.program and programs_gone is None and begun and not processes_with(args.token, args.program):
            programs_gone = time.monotonic()
        if launcher_gone is not None and not processes_with(args.token):
            last_gone = time.monotonic()
            break
        time.sleep(0.02)
    reader.join(timeout=2)

    left = processes_with(args.token)
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

    origin = begun[0] if begun else start
    for when, line in lines:
        print(f"[{when - origin:+7.2f} s] {line}")
    if not begun:
        print(f"job_ends: FAILED: the job never printed '{args.begin}'")
        return 1
    if last_gone is None:
        print(f"job_ends: FAILED: processes {left} still there {args.limit:.0f} s after the start (killed now)")
        return 1
    took = last_gone - origin
    print(f"job_ends: the launcher exited {launcher_gone - origin:.2f} s and the last process went {took:.2f} s "
          f"after '{args.begin}' (bound {args.bound:.2f} s, exit code {job.returncode})")
    if args.program:
        took = (programs_gone if programs_gone is not None else last_gone) - origin
        print(f"job_ends: the last of {', '.join(args.program)} went {took:.2f} s after '{args.begin}' "
              f"(bound {args.bound:.2f} s; the rest is the harness's teardown)")
    if took > args.bound:
        print("job_ends: FAILED: past the bound")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
