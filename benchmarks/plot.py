#!/usr/bin/python3
"""Figures from saved benchmark outputs (benchmarks/make_plots.sh runs the benchmarks and then this).

  plot.py allreduce --herd results/allreduce_np2.txt [--gloo results/gloo_np2.txt] -o plots/allreduce_np2.png
  plot.py training [--fashion-mnist results/fashion_mnist.txt] [--ddp results/vs_pytorch_ddp_cnn.txt ...]
                   -o plots/training.png

allreduce: bus bandwidth against message size from benchmarks/allreduce's first table (herd, herd's ring,
MPI_Allreduce, and one core's memcpy as a dashed limit) and, if given, gloo_allreduce.py's table measured
at the same rank count. busbw is recomputed from the tables' times (the printed GB/s are rounded to 0.001).
training: samples per second as bars, one panel per file: fashion_mnist.sh's table (herd + Eigen at each
rank count) and vs_pytorch_ddp/run.sh's (herd overlapped, herd blocking, PyTorch DDP at each rank count).

The machine named under each title is the first `# machine: ...` line of the inputs (make_plots.sh
writes one), or --machine. Needs only Debian's python3-matplotlib; draws without a display (Agg).
"""

import argparse
import math
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

MACHINE = re.compile(r"^#\s*machine:\s*(.+?)\s*$")
RANKS = re.compile(r"\b(\d+) ranks?\b")
CORES = re.compile(r"\b(\d+) (?:cores|vCPUs)\b")
SIZE_ROW = re.compile(r"^\s*\d+\s*\|")


class InputError(Exception):
    pass


def read_lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None


def machine_of(lines):
    for line in lines:
        m = MACHINE.match(line)
        if m:
            return m.group(1)
    return None


def number(field, path, line):
    field = field.strip()
    if field == "-":
        return None
    try:
        return float(field)
    except ValueError:
        raise InputError(f"{path}: '{field}' is not a number in the row '{line.strip()}'") from None


def size_table(path, lines, header_words, groups):
    """Rank count and rows (lists of '|'-separated groups, each a list of numbers) of the first table
    whose '#' title contains header_words; rows stop at the first line that is neither a row nor '#'."""
    title = None
    rows = []
    for line in lines:
        if title is None:
            if line.startswith("#") and all(w in line for w in header_words) and RANKS.search(line):
                title = line
            continue
        if SIZE_ROW.match(line):
            parts = line.split("|")
            if len(parts) != groups:
                raise InputError(f"{path}: the row '{line.strip()}' has {len(parts)} '|'-separated groups, "
                                 f"expected {groups}")
            rows.append([[number(v, path, line) for v in p.split()] for p in parts])
        elif rows or not line.startswith("#"):
            break
    if title is None or not rows:
        raise InputError(f"{path}: no table titled '# {' ... '.join(header_words)} ... N ranks' with rows "
                         f"'bytes | ...' in it")
    return int(RANKS.search(title).group(1)), title, rows


def busbw(nbytes, microseconds, ranks):
    if microseconds is None or microseconds <= 0:
        return math.nan
    factor = 2.0 * (ranks - 1) / ranks if ranks > 1 else 1.0
    return nbytes / (microseconds * 1e-6) / 1e9 * factor


def size_label(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def size_ticks(sizes):
    """Labelled sizes: the first, the last, and 1, 8 and 64 of each unit (8 B, 1 KiB, 64 KiB, 1 MiB ...),
    leaving out those within two doublings of the ends so that labels do not collide."""
    low, high = round(math.log2(min(sizes))), round(math.log2(max(sizes)))
    inner = [k for k in range(low + 2, high - 1) if k % 10 in (0, 3, 6)]
    return [2.0 ** k for k in sorted({low, *inner, high})]


def plot_allreduce(args):
    herd_lines = read_lines(args.herd)
    ranks, title, rows = size_table(args.herd, herd_lines, ["allreduce", "MPI_Allreduce"], 6)
    path = re.search(r"allreduce \(([^)]+)\)", title)
    sizes = [r[0][0] for r in rows]
    series = [  # (label, sizes, busbw, line style)
        (f"herd ({path.group(1)})" if path else "herd", sizes, [busbw(r[0][0], r[1][0], ranks) for r in rows],
         dict(color="C0", linewidth=2.4, marker="o", zorder=4)),
        ("herd, ring over MPI messages", sizes, [busbw(r[0][0], r[2][0], ranks) for r in rows],
         dict(color="C1", marker="s")),
        ("MPI_Allreduce", sizes, [busbw(r[0][0], r[3][0], ranks) for r in rows], dict(color="C2", marker="^")),
    ]
    machine = args.machine or machine_of(herd_lines)
    if args.gloo:
        gloo_lines = read_lines(args.gloo)
        gloo_ranks, _, gloo_rows = size_table(args.gloo, gloo_lines, ["gloo allreduce"], 2)
        if gloo_ranks != ranks:
            raise InputError(f"{args.gloo} was measured at {gloo_ranks} ranks and {args.herd} at {ranks}: "
                             f"give the gloo table of the same rank count")
        series.append(("PyTorch gloo (torch.distributed)", [r[0][0] for r in gloo_rows],
                       [busbw(r[0][0], r[1][0], ranks) for r in gloo_rows], dict(color="C3", marker="D")))
        machine = machine or machine_of(gloo_lines)

    fig, ax = plt.subplots(figsize=(10, 6), layout="constrained")
    for name, xs, values, style in series:
        ax.plot(xs, values, label=name, markersize=4, **style)
    ax.plot(sizes, [r[5][0] for r in rows], label="memcpy on one core (memory limit)", color="0.45",
            linestyle="--", linewidth=1.6)

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = size_ticks(sizes)
    ax.set_xticks(ticks, [size_label(t) for t in ticks])
    ax.set_xticks([2.0 ** k for k in range(round(math.log2(min(sizes))), round(math.log2(max(sizes))) + 1)],
                  minor=True)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=20))  # every decade labelled
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6f}".rstrip("0").rstrip(".") if v < 1 else f"{v:g}"))
    ax.set_xlabel("message size (f32 sum, in place)")
    ax.set_ylabel("bus bandwidth, GB/s (log scale)")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", axis="x", alpha=0.12)
    ax.legend(loc="lower right", fontsize=9, framealpha=0.9)
    heading = f"allreduce bus bandwidth, {ranks} ranks"
    cores = CORES.search(machine or "")
    if cores and ranks > int(cores.group(1)):
        heading += f" sharing {cores.group(1)} cores (oversubscribed)"
    if machine:
        heading += f"\n{machine}"
    ax.set_title(heading, fontsize=11)
    ax.text(1.0, -0.1, "busbw = bytes / time x 2(n-1)/n; slowest rank, median of repetitions",
            transform=ax.transAxes, ha="right", va="top", fontsize=8, color="0.35")
    fig.savefig(args.output, dpi=args.dpi)
    print(f"plot.py: wrote {args.output}")


FASHION_ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)x\s+([\d.]+)%\s+([\d.]+)\s*$")
DDP_ROW = re.compile(r"^(herd overlapped|herd blocking|PyTorch DDP \(gloo\)) (\d+) ranks?\s+([\d.]+)\s+([\d.]+)\s")
DDP_MODEL = re.compile(r"^# herd \+ libtorch vs PyTorch DDP: (.+?) on Fashion-MNIST")
DDP_SIDES = [("herd overlapped", "herd, overlapped (DDP-style buckets)", "C0"),
             ("herd blocking", "herd, blocking (distributed_optimizer)", "C9"),
             ("PyTorch DDP (gloo)", "PyTorch DDP (gloo)", "C3")]


def fashion_mnist_panel(ax, path):
    lines = read_lines(path)
    rows = [FASHION_ROW.match(line) for line in lines]
    rows = [(int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))) for m in rows if m]
    if not rows:
        raise InputError(f"{path}: no rows 'ranks  s/epoch  samples/s  speed-up  reduce  accuracy' in it; "
                         f"is it the output of benchmarks/fashion_mnist.sh?")
    epochs = next((m.group(1) for m in map(re.compile(r"^# fashion_mnist, (\d+) epochs").match, lines) if m), None)
    labels = [f"{n} rank{'s' if n > 1 else ''}" for n, *_ in rows]
    bars = ax.bar(labels, [r[2] for r in rows], color="C0", width=0.55)
    ax.bar_label(bars, [f"{r[2]:,.0f}\n{r[1]:.2f} s/epoch, speed-up {r[3]:.2f}x" for r in rows], fontsize=8, padding=3)
    ax.set_title("herd + Eigen: examples/fashion_mnist\n(MLP 784-256-128-10, batch 64 per rank"
                 + (f", {epochs} epoch{'' if epochs == '1' else 's'})" if epochs else ")"), fontsize=10)
    return machine_of(lines)


def ddp_panel(ax, path):
    lines = read_lines(path)
    values = {}
    for line in lines:
        m = DDP_ROW.match(line)
        if m:
            values[(m.group(1), int(m.group(2)))] = float(m.group(4))
    if not values:
        raise InputError(f"{path}: no rows 'herd overlapped N ranks ...' in it; "
                         f"is it the output of benchmarks/vs_pytorch_ddp/run.sh?")
    model = next((m.group(1) for m in map(DDP_MODEL.match, lines) if m), "libtorch")
    rank_counts = sorted({n for _, n in values})
    width = 0.8 / len(DDP_SIDES)
    for i, (key, name, color) in enumerate(DDP_SIDES):
        xs = [j + (i - (len(DDP_SIDES) - 1) / 2) * width for j in range(len(rank_counts))]
        heights = [values.get((key, n), math.nan) for n in rank_counts]
        bars = ax.bar(xs, heights, width * 0.95, label=name, color=color)
        ax.bar_label(bars, [f"{h:,.0f}" if h == h else "" for h in heights], fontsize=8, padding=2)
    ax.set_xticks(range(len(rank_counts)), [f"{n} rank{'s' if n > 1 else ''}" for n in rank_counts])
    ax.set_title(f"herd + libtorch vs PyTorch DDP\n{model}", fontsize=10)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    return machine_of(lines)


def plot_training(args):
    panels = [(fashion_mnist_panel, args.fashion_mnist)] if args.fashion_mnist else []
    panels += [(ddp_panel, path) for path in args.ddp]
    if not panels:
        raise InputError("training needs --fashion-mnist FILE or --ddp FILE (or both)")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels) + 0.6, 5.4), layout="constrained",
                             squeeze=False)
    machine = args.machine
    for ax, (draw, path) in zip(axes[0], panels):
        found = draw(ax, path)
        machine = machine or found
        ax.set_ylabel("training samples/s, all ranks")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.margins(y=0.22)
        ax.grid(True, axis="y", alpha=0.35)
        ax.set_axisbelow(True)
    fig.suptitle("Data-parallel training throughput (higher is better)" + (f"\n{machine}" if machine else ""),
                 fontsize=11)
    fig.savefig(args.output, dpi=args.dpi)
    print(f"plot.py: wrote {args.output}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="figure", required=True)
    a = sub.add_parser("allreduce", help="busbw vs message size at one rank count")
    a.add_argument("--herd", required=True, help="benchmarks/allreduce's output")
    a.add_argument("--gloo", help="gloo_allreduce.sh's output at the same rank count")
    t = sub.add_parser("training", help="samples/s bars")
    t.add_argument("--fashion-mnist", help="benchmarks/fashion_mnist.sh's output")
    t.add_argument("--ddp", action="append", default=[], help="benchmarks/vs_pytorch_ddp/run.sh's output (repeatable)")
    for s in (a, t):
        s.add_argument("-o", "--output", required=True, help="the PNG to write")
        s.add_argument("--machine", help="the machine's description under the title (default: '# machine:' line)")
        s.add_argument("--dpi", type=int, default=130)
    args = p.parse_args()
    try:
        (plot_allreduce if args.figure == "allreduce" else plot_training)(args)
    except InputError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
