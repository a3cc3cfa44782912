#!/usr/bin/python3
"""The PyTorch DDP side of benchmarks/vs_pytorch_ddp: the training of examples/libtorch/mnist.cpp
(Horovod's MNIST net on Fashion-MNIST, SGD lr 0.01 x world size, momentum 0.5, batch 64 per rank)
under torch.nn.parallel.DistributedDataParallel with the gloo backend, or, with --device cuda, on
the GPU (rank modulo the GPU count) with the nccl backend.

One process per rank, started by hand (Debian's torchrun does not work):

  MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=2 /usr/bin/python3 ddp_mnist.py &
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=1 WORLD_SIZE=2 /usr/bin/python3 ddp_mnist.py &

The data path mirrors the C++ side so that both time the same work: the whole set is decoded and
normalized once (not timed); each step index_selects its batch from that tensor (timed, on both
sides). No DataLoader: its per-sample collation would be measured instead of DDP.
Rank 0 prints per-epoch lines and, at the end, `final test accuracy:`, `summary:`, `phases:` and
`overlap:` lines in the format of libtorch_mnist. --model mlp trains the MLP 784-2048-2048-10 of
libtorch_mnist --model mlp.

The overlap line is measured with a communication hook that does what DDP's default one does
(divide the bucket by the world size, allreduce it) and stamps each bucket's start and end:
`communication` sums the buckets' durations; `waited` runs from the start of the last bucket (when
backward's last gradient was ready) to the end of the last one to finish; hidden = communication
- waited.
"""

import argparse
import datetime
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

PACKAGE_HINT = ("The Fashion-MNIST files come from the Debian package dataset-fashion-mnist "
                "(sudo apt-get install dataset-fashion-mnist, which puts them in /usr/share/datasets/fashion-mnist); "
                "or point --data at a directory holding them")


class DataError(Exception):
    pass


def read_idx(path, magic, dims):
    """The payload of a gzip IDX file as a uint8 array of `dims` dimensions."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read it ({e}). {PACKAGE_HINT}") from None
    header = 4 + 4 * dims
    if len(raw) < header or int.from_bytes(raw[:4], "big") != magic:
        raise DataError(f"{path}: not an IDX file with magic {magic:#010x}. {PACKAGE_HINT}")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    data = np.frombuffer(raw, dtype=np.uint8, offset=header)
    if data.size != int(np.prod(shape)):
        raise DataError(f"{path}: holds {data.size} bytes of data, its header announces {shape}. {PACKAGE_HINT}")
    return data.reshape(shape)


def load_split(directory, prefix):
    images = read_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), 0x803, 3)
    labels = read_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), 0x801, 1)
    if len(images) != len(labels):
        raise DataError(f"{directory}: {prefix} has {len(images)} images but {len(labels)} labels. {PACKAGE_HINT}")
    # The same normalization as the C++ side: [0, 1], then Fashion-MNIST's mean and deviation.
    x = torch.from_numpy(images.astype(np.float32)).unsqueeze(1).div_(255.0).sub_(0.2860).div_(0.3530)
    return x, torch.from_numpy(labels.astype(np.int64))


class MLP(nn.Module):
    """libtorch_mnist --model mlp."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 2048)
        self.fc2 = nn.Linear(2048, 2048)
        self.fc3 = nn.Linear(2048, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x.view(-1, 784)))
        x = F.relu(self.fc2(x))
        return F.log_softmax(self.fc3(x), dim=1)


class Net(nn.Module):
    """Horovod's pytorch_mnist.py network."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="at most N steps per epoch (0: the whole epoch)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01, help="single-rank rate, multiplied by the world size")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--train-samples", type=int, default=0)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the model on GPU rank %% count, DDP over nccl (libtorch_mnist uses the GPU when it sees one)")
    return p.parse_args()


def main():
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(args.threads)

    problem = None
    try:
        train_x, train_y = load_split(args.data, "train")
        test_x, test_y = load_split(args.data, "t10k")
    except DataError as e:
        problem = str(e)
    device = torch.device("cpu")
    backend = "gloo"
    if args.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    # Join the group even after a data error, so that every rank learns of it and exits.
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(minutes=5))
    failed = torch.tensor([1 if problem else 0], device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item():
        if problem:
            print(f"ddp_mnist (rank {rank}): {problem}", file=sys.stderr)
        dist.destroy_process_group()
        return 1

    train_count = len(train_y)
    if 0 < args.train_samples < train_count:
        train_count = args.train_samples

    torch.manual_seed(args.seed)
    model = (MLP() if args.model == "mlp" else Net()).to(device)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    buckets = []  # (start, end) of each bucket's allreduce in the current step

    def timed_allreduce(_, bucket):
        start = time.perf_counter()
        tensor = bucket.buffer().div_(world)
        future = dist.all_reduce(tensor, async_op=True).get_future()
        entry = [start, start]
        buckets.append(entry)

        def done(f):
            entry[1] = time.perf_counter()
            return f.value()[0]

        return future.then(done)

    if world > 1:
        ddp.register_comm_hook(None, timed_allreduce)
    overlap = np.zeros(2)  # communication, waited
    # Different dropout masks per rank, as on the C++ side.
    torch.manual_seed(args.seed + rank + 1)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr * world, momentum=0.5)
    sampler = DistributedSampler(range(train_count), num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    steps = (len(sampler) + args.batch_size - 1) // args.batch_size
    if 0 < args.steps < steps:
        steps = args.steps
    if rank == 0:
        print(f"ddp_mnist: {world} rank{'s' if world > 1 else ''} ({backend}, {device.type}), torch {torch.__version__}, "
              f"{torch.get_num_threads()} intra-op / {torch.get_num_interop_threads()} inter-op threads per rank, "
              f"{train_count} training samples ({len(sampler)} per rank), batch {args.batch_size} per rank, "
              f"{steps} steps per epoch, SGD lr {args.lr * world:g} momentum 0.5", flush=True)

    seconds_total = 0.0  # the slowest rank's step-loop time, summed over epochs
    samples_total = 0
    phases = np.zeros(4)  # batch, forward, backward (DDP's allreduce overlaps it), optimizer
    accuracy = 0.0
    for epoch in range(args.epochs):
        ddp.train()
        sampler.set_epoch(epoch)
        batches = torch.tensor(list(sampler), dtype=torch.int64).split(args.batch_size)
        loss_sum = 0.0
        loss_count = 0
        dist.barrier()  # ranks start the timed loop together
        start = time.perf_counter()
        for step in range(steps):
            index = batches[step]
            t0 = time.perf_counter()
            x = train_x.index_select(0, index).to(device)  # as libtorch_mnist: select on the host, then copy
            y = train_y.index_select(0, index).to(device)
            t1 = time.perf_counter()
            optimizer.zero_grad()
            buckets.clear()
            loss = F.nll_loss(ddp(x), y)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            optimizer.step()
            t4 = time.perf_counter()
            phases += (t1 - t0, t2 - t1, t3 - t2, t4 - t3)
            if buckets:
                last_start = max(b[0] for b in buckets)
                overlap += (sum(b[1] - b[0] for b in buckets), max(0.0, max(b[1] for b in buckets) - last_start))
            loss_sum += loss.item() * len(index)
            loss_count += len(index)
        elapsed = time.perf_counter() - start

        slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        samples = sum(len(batches[s]) for s in range(steps))
        totals = torch.tensor([loss_sum, loss_count, samples], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        seconds_total += slowest.item()
        samples_total += int(totals[2].item())

        # Each rank scores test images rank, rank + world, ... (no padding), summed over ranks.
        model.eval()
        with torch.no_grad():
            mine = torch.arange(rank, len(test_y), world)
            scores = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
            for index in mine.split(1000):
                out = model(test_x.index_select(0, index).to(device))
                y = test_y.index_select(0, index).to(device)
                scores += torch.tensor([F.nll_loss(out, y, reduction="sum").item(),
                                        out.argmax(1).eq(y).sum().item(), len(index)], dtype=torch.float64,
                                       device=device)
        dist.all_reduce(scores)
        accuracy = (scores[1] / scores[2]).item()
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {totals[0] / totals[1]:.4f}  "
                  f"test loss {scores[0] / scores[2]:.4f}  test accuracy {accuracy:.4f}  "
                  f"train {slowest.item():.1f} s  {totals[2].item() / slowest.item():.0f} samples/s", flush=True)

    mean_phases = torch.tensor(np.concatenate([phases, overlap]), dtype=torch.float64, device=device)
    dist.all_reduce(mean_phases)
    mean_phases *= 1e3 / world / (steps * args.epochs)
    if rank == 0:
        print(f"final test accuracy: {accuracy:.4f}")
        print(f"summary: ranks={world} epochs={args.epochs} seconds_per_epoch={seconds_total / args.epochs:.3f} "
              f"samples_per_second={samples_total / seconds_total:.1f} test_accuracy={accuracy:.4f}")
        b, f, bw, o, comm, waited = mean_phases.tolist()
        print(f"phases: ms_per_step batch={b:.3f} forward={f:.3f} backward+allreduce={bw:.3f} optimizer={o:.3f}")
        print(f"overlap: ms_per_step communication={comm:.3f} waited={waited:.3f} hidden={comm - waited:.3f}",
              flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
