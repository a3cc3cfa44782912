#!/usr/bin/python3
"""PyTorch's results for herd's parity checks (tests/parity), written once per build.

  reference.py OUTDIR

For each check it writes OUTDIR/<check>.safetensors: the inputs (from a fixed seed) and what
PyTorch computes from them; herd's parity programs compute the same from those inputs and compare.
PyTorch runs its scalar CPU kernels (ATEN_CPU_CAPABILITY=default, set before torch is imported):
its vectorized kernels fuse a + alpha * b into one FMA where the machine has one, so their last
bit depends on the CPU; the scalar kernels round each operation, as herd does, and so can be
compared bit for bit. Without torch it writes OUTDIR/torch_missing and the checks are skipped;
with it, OUTDIR/torch_version (torch.__version__), so that herd's side compares with what that
version does.

The DDP and ZeRO checks start this script again once per rank (reference.py --rank all WORLD
OUTDIR, with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE set) for torch.distributed over gloo;
each rank process runs both checks' parts, as starting one costs more than they do.
"""
import json
import os
import struct
import sys

os.environ["ATEN_CPU_CAPABILITY"] = "default"
RANK_PROCESS = len(sys.argv) == 5 and sys.argv[1] == "--rank"
out = sys.argv[-1]
os.makedirs(out, exist_ok=True)
try:
    import numpy as np
    import torch
except ImportError as e:
    open(os.path.join(out, "torch_missing"), "w").write(f"torch is not importable: {e}\n")
    print(f"parity: torch is not importable ({e}); the parity checks are skipped")
    sys.exit(0)
if os.path.exists(os.path.join(out, "torch_missing")) and not RANK_PROCESS:
    os.remove(os.path.join(out, "torch_missing"))
if not RANK_PROCESS:
    # Each check compares with what this PyTorch does (AdamW's first moment, DDP's unused parameters).
    open(os.path.join(out, "torch_version"), "w").write(torch.__version__ + "\n")
    print(f"parity: the reference is PyTorch {torch.__version__} ({torch.__file__})")

ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
             torch.bool: "BOOL", torch.complex64: "C64"}


def save(check, tensors):
    """A safetensors file (8-byte header length, JSON header, data), without the safetensors package.
    A value may be (dtype name, bytes, shape) for a dtype this torch lacks."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if isinstance(t, tuple):
            dtype, blob, shape = t
        else:
            t = t.detach().contiguous().cpu()
            bits = t.view(torch.int16) if t.dtype == torch.bfloat16 else torch.view_as_real(t) if t.is_complex() else t
            dtype, blob, shape = ST_DTYPES[t.dtype], bits.numpy().tobytes(), list(t.shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, check + ".safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


STEPS = 50
SIZES = (37, 5)  # the second parameter starts at 0


def optimizer_inputs(gen, dtype):
    init = [torch.randn(SIZES[0], generator=gen, dtype=torch.float64).to(dtype), torch.zeros(SIZES[1], dtype=dtype)]
    grads = [torch.randn(STEPS, n, generator=gen, dtype=torch.float64).to(dtype) for n in SIZES]
    return init, grads


def sqrt_correctly_rounded():
    """[f32, f64]: whether torch.sqrt rounds to the nearest here, as IEEE 754 (and numpy) do. PyPI's
    x86 wheels take it from MKL's vector math, within 1 ulp but not always the nearest (Debian's
    1.13, without MKL, rounds correctly); where it does not, AdamW's parameters can only agree
    within a bound."""
    gen = torch.Generator().manual_seed(19)
    exact = []
    for dtype in (torch.float32, torch.float64):
        xs = [torch.rand(n, generator=gen, dtype=torch.float64).to(dtype) * 10.0 ** e for n in (5, 37, 4096) for e in (-6, 0)]
        exact.append(int(all(np.array_equal(x.sqrt().numpy(), np.sqrt(x.numpy())) for x in xs)))
    return torch.tensor(exact, dtype=torch.int64)


def optimizer_check(check, cases, make, state_names=()):
    """Each case's options, inputs and PyTorch's parameters after every one of STEPS steps (and the
    optimizer state named, after every step)."""
    gen = torch.Generator().manual_seed(18)
    tensors = {"cases": torch.tensor([len(cases)], dtype=torch.int64), "sqrt_correctly_rounded": sqrt_correctly_rounded()}
    for c, options in enumerate(cases):
        tensors[f"{c}.options"] = torch.tensor(options, dtype=torch.float64)
        for dtype, dn in ((torch.float32, "f32"), (torch.float64, "f64")):
            init, grads = optimizer_inputs(gen, dtype)
            params = [p.clone().requires_grad_() for p in init]
            opt = make(params, options)
            trajectory = [torch.empty(STEPS, n, dtype=dtype) for n in SIZES]
            states = {(name, k): torch.empty(STEPS, n, dtype=dtype) for name in state_names for k, n in enumerate(SIZES)}
            for s in range(STEPS):
                for p, g in zip(params, grads):
                    p.grad = g[s].clone()
                opt.step()
                for k, p in enumerate(params):
                    trajectory[k][s] = p.detach()
                    for name in state_names:
                        states[name, k][s] = opt.state[p][name]
            for k in range(len(SIZES)):
                tensors[f"{c}.{dn}.init.{k}"] = init[k]
                tensors[f"{c}.{dn}.grads.{k}"] = grads[k]
                tensors[f"{c}.{dn}.torch.{k}"] = trajectory[k]
            for (name, k), t in states.items():
                tensors[f"{c}.{dn}.{name}.{k}"] = t
    save(check, tensors)


# (dataset size, ranks, drop_last): sizes that divide, that do not, and smaller than the world.
SAMPLER_CASES = [(n, w, d) for n in (1, 5, 10, 11, 64, 101) for w in (1, 2, 3, 4, 7) for d in (0, 1)]


def sampler_check():
    """DistributedSampler's indices for every rank of every case, in order, without and with shuffling."""
    from torch.utils.data import DistributedSampler
    tensors = {"cases": torch.tensor(SAMPLER_CASES, dtype=torch.int64)}
    for c, (n, w, d) in enumerate(SAMPLER_CASES):
        for r in range(w):
            for shuffle in (0, 1):
                s = DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=bool(shuffle), drop_last=bool(d), seed=5)
                tensors[f"{c}.{r}.{shuffle}"] = torch.tensor(list(s), dtype=torch.int64)
    save("sampler", tensors)


def run_checks():
    # [lr, momentum, dampening, nesterov, weight_decay]
    optimizer_check("sgd", [[0.1, 0, 0, 0, 0], [0.05, 0.9, 0, 0, 0], [0.05, 0.9, 0.25, 0, 0.01], [0.02, 0.8, 0, 1, 0.05]],
                    lambda ps, o: torch.optim.SGD(ps, lr=o[0], momentum=o[1], dampening=o[2], nesterov=bool(o[3]),
                                                  weight_decay=o[4]))
    # [lr, beta1, beta2, eps, weight_decay]
    optimizer_check("adamw", [[1e-3, 0.9, 0.999, 1e-8, 1e-2], [0.01, 0.8, 0.95, 1e-6, 0.1]],
                    lambda ps, o: torch.optim.AdamW(ps, lr=o[0], betas=(o[1], o[2]), eps=o[3], weight_decay=o[4]),
                    ("exp_avg", "exp_avg_sq"))
    loss_scaler_check()
    sampler_check()
    clip_check()
    safetensors_check()
    sync_batch_norm_check()
    unused_gradients_check()
    distributed_checks()


def grad_scaler_update(scale, tracker, found_inf, growth, backoff, interval, cap):
    """torch.cuda.amp.GradScaler's update (the _amp_update_scale_ kernel, which has no CPU
    implementation in torch 1.13), transcribed: the scale is an f32 tensor there; a grown scale
    that is not finite is not taken. apex's cap (max_loss_scale) on top where cap is finite."""
    if found_inf:
        return scale * np.float32(backoff), 0
    if tracker + 1 == interval:
        grown = np.float32(scale * np.float32(growth))
        return (min(grown, np.float32(cap)) if np.isfinite(grown) else scale), 0
    return scale, tracker + 1


def loss_scaler_check():
    """f16 parameters with f32 masters stepped by SGD, under the scaler: gradients scaled by the
    current scale (some overflow by themselves, some runs of steps carry a planted inf or NaN);
    unscaled as GradScaler.unscale_ does (times the f32 reciprocal of the scale)."""
    gen = torch.Generator().manual_seed(24)
    steps, n = 60, 23
    # [initial scale, growth interval, cap, gradient size, share of planted overflows]: apex's cap
    # reached and held; no cap (GradScaler) with scales that grow until gradients overflow by themselves.
    cases = [[2.0 ** 20, 3, 2.0 ** 24, 1e-4, 0.03], [2.0 ** 16, 2, float("inf"), 3e-3, 0.12]]
    tensors = {"cases": torch.tensor([len(cases)], dtype=torch.int64)}
    for c, (initial, interval, cap, size, share) in enumerate(cases):
        planted = torch.rand(steps, generator=gen) < share
        planted[[5, 6, 7, 30, 31]] = True  # consecutive overflows
        master = (torch.randn(n, generator=gen) * 0.5).half().float().requires_grad_()
        param16 = master.detach().half()
        tensors[f"{c}.init"] = param16
        opt = torch.optim.SGD([master], lr=0.1, momentum=0.9)
        scale, tracker = np.float32(initial), 0
        grads16 = torch.empty(steps, n, dtype=torch.float16)
        scales = torch.empty(steps + 1, dtype=torch.float64)
        trajectory = torch.empty(steps, n, dtype=torch.float16)
        scales[0] = float(scale)
        for s in range(steps):
            g = (torch.randn(n, generator=gen, dtype=torch.float64) * size * float(scale)).half()
            if planted[s]:
                g[s % n] = float("inf") if s % 2 else float("nan")
            grads16[s] = g
            inv_scale = torch.tensor([float(scale)], dtype=torch.float64).reciprocal().float()
            master.grad = g.float() * inv_scale
            found_inf = not bool(torch.isfinite(master.grad).all())
            if not found_inf:
                opt.step()
                param16 = master.detach().half()
            scale, tracker = grad_scaler_update(scale, tracker, found_inf, 2.0, 0.5, interval, cap)
            scales[s + 1] = float(scale)
            trajectory[s] = param16
        tensors[f"{c}.options"] = torch.tensor([initial, interval, cap, size, share], dtype=torch.float64)
        tensors[f"{c}.grads"] = grads16
        tensors[f"{c}.scales"] = scales
        tensors[f"{c}.torch"] = trajectory
    save("loss_scaler", tensors)


def clip_check():
    """torch.nn.utils.clip_grad_norm_ on f32 gradients (a norm that clips, one that does not), and
    on f16 gradients scaled by 2^10 after GradScaler's unscale_ (into f32)."""
    gen = torch.Generator().manual_seed(25)
    sizes = (37, 5, 64)
    tensors = {}
    for c, max_norm in enumerate((0.5, 1e3)):
        grads = [torch.randn(n, generator=gen) for n in sizes]
        params = [torch.zeros(n, requires_grad=True) for n in sizes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        tensors[f"{c}.max_norm"] = torch.tensor([max_norm], dtype=torch.float64)
        tensors[f"{c}.total"] = total.double().reshape(1)
        for k, (p, g) in enumerate(zip(params, grads)):
            tensors[f"{c}.grad.{k}"] = g
            tensors[f"{c}.torch.{k}"] = p.grad
    scale = 1024.0
    grads16 = [(torch.randn(n, generator=gen) * scale).half() for n in sizes]
    params = [torch.zeros(n, requires_grad=True) for n in sizes]
    inv_scale = torch.tensor([scale], dtype=torch.float64).reciprocal().float()
    for p, g in zip(params, grads16):
        p.grad = g.float() * inv_scale
    total = torch.nn.utils.clip_grad_norm_(params, 2.0)
    tensors["amp.total"] = total.double().reshape(1)
    for k, (p, g) in enumerate(zip(params, grads16)):
        tensors[f"amp.grad.{k}"] = g
        tensors[f"amp.torch.{k}"] = p.grad
    save("clip_grad_norm", tensors)


def safetensors_check():
    """A file with a tensor of every dtype safetensors has (those this torch lacks written as raw
    bytes) and a BatchNorm2d's state_dict (num_batches_tracked is I64); the values of herd's dtypes
    again, as F64, in a second file."""
    gen = torch.Generator().manual_seed(26)
    values = torch.randn(6, generator=gen, dtype=torch.float64) * 3
    tensors, expect = {}, {}
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
                  torch.int64):
        t = values.to(dtype) if dtype.is_floating_point else (values * 10).to(dtype)
        tensors["t." + ST_DTYPES[dtype]] = t
        expect["t." + ST_DTYPES[dtype]] = t.double()
    tensors["t.BOOL"] = values > 0
    tensors["t.I16"] = (values * 100).to(torch.int16)
    tensors["t.C64"] = torch.complex(values.float(), -values.float())
    raw = bytes(range(48))
    for name, size in (("U16", 2), ("U32", 4), ("U64", 8), ("F8_E4M3", 1), ("F8_E5M2", 1)):
        tensors["t." + name] = (name, raw[: 6 * size], [6])
    bn = torch.nn.BatchNorm2d(4)
    bn.train()
    bn(torch.randn(8, 4, 3, 3, generator=gen))
    for name, t in bn.state_dict().items():
        tensors["bn." + name] = t
        if t.dtype == torch.float32:
            expect["bn." + name] = t.double()
    save("safetensors", tensors)
    save("safetensors_expect", expect)



# Each iteration's split of the global batch of 7 over 2 and 3 ranks; the second leaves a rank empty.
SPLITS = {2: [[3, 4], [0, 7], [5, 2]], 3: [[2, 2, 3], [3, 0, 4], [1, 4, 2]]}


def sync_batch_norm_check():
    """BatchNorm2d over the whole batch (f64, so that the comparison sees the method, not f32 sums):
    three training iterations (outputs, input gradients, weight and bias gradients, running
    statistics), then eval: with running statistics on every rank's part, without them each part
    on its own statistics (SyncBatchNorm syncs in training only)."""
    gen = torch.Generator().manual_seed(27)
    channels, n = 3, 7
    # [affine, track_running_stats, momentum (-1: None)]
    cases = [[1, 1, 0.1], [0, 1, 0.1], [1, 0, 0.1], [1, 1, -1], [0, 0, -1]]
    tensors = {"cases": torch.tensor([len(cases)], dtype=torch.int64)}
    for w, splits in SPLITS.items():
        tensors[f"split.{w}"] = torch.tensor(splits, dtype=torch.int64)
    for c, (affine, track, momentum) in enumerate(cases):
        p = f"{c}."
        bn = torch.nn.BatchNorm2d(channels, affine=bool(affine), track_running_stats=bool(track),
                                  momentum=None if momentum < 0 else momentum).double()
        tensors[p + "options"] = torch.tensor([affine, track, momentum], dtype=torch.float64)
        if affine:
            with torch.no_grad():
                bn.weight.copy_(torch.rand(channels, generator=gen, dtype=torch.float64) + 0.5)
                bn.bias.copy_(torch.randn(channels, generator=gen, dtype=torch.float64))
            tensors[p + "weight"] = bn.weight.detach().clone()
            tensors[p + "bias"] = bn.bias.detach().clone()
        bn.train()
        for it in range(3):
            q = f"{p}{it}."
            x = (torch.randn(n, channels, 4, 5, generator=gen, dtype=torch.float64) * 2 + 1).requires_grad_()
            out_weight = torch.randn(n, channels, 4, 5, generator=gen, dtype=torch.float64)
            y = bn(x)
            (y * out_weight).sum().backward()
            tensors[q + "x"], tensors[q + "out_weight"] = x.detach(), out_weight
            tensors[q + "y"], tensors[q + "dx"] = y.detach(), x.grad
            if affine:
                tensors[q + "dweight"], tensors[q + "dbias"] = bn.weight.grad.clone(), bn.bias.grad.clone()
                bn.weight.grad, bn.bias.grad = None, None
            if track:
                tensors[q + "running_mean"] = bn.running_mean.clone()
                tensors[q + "running_var"] = bn.running_var.clone()
                tensors[q + "num_batches_tracked"] = bn.num_batches_tracked.clone().reshape(1)
        bn.eval()
        x = torch.randn(n, channels, 4, 5, generator=gen, dtype=torch.float64)
        tensors[p + "eval.x"] = x
        with torch.no_grad():
            for w, splits in SPLITS.items():
                parts = torch.split(x, splits[0])
                tensors[f"{p}eval.y.{w}"] = torch.cat([bn(part) for part in parts])
    save("sync_batch_norm", tensors)


# DDP: torch.nn.parallel.DistributedDataParallel (gloo) at 2 and 3 ranks, each rank a process of
# this script; herd's libtorch DDP runs the same model (parity_torch.cpp builds it alike) on the
# same batches. Each scenario: 3 iterations of SGD with momentum. The model has a BatchNorm (its
# buffers broadcast from rank 0 at each forward), a layer only rank 1 uses and one no rank uses.
# [find_unused_parameters, bucket bytes (0: DDP's default), gradient_as_bucket_view,
#  zero_grad(set_to_none), backward passes per step (k - 1 under no_sync())]
DDP_SCENARIOS = [[1, 0, 0, 0, 1], [1, 256, 1, 0, 1], [1, 256, 1, 1, 1], [1, 0, 0, 1, 2], [1, 256, 1, 0, 3]]
DDP_ITERATIONS, DDP_BATCH = 3, 4
# Uneven inputs and static_graph, on the same model: [Join([ddp]) (the last rank has 1 iteration,
# the others DDP_ITERATIONS; buffers broadcast from the highest rank still training),
# static_graph, find_unused_parameters, bucket bytes (0: DDP's default), early pass (0: none;
# 1 or 2: a first pass under no_sync() where rank 0 alone uses `extra`, which the second pass uses
# on no rank (1) or on rank 1 (2); without one, rank 1 uses it)]
DDP_MORE_SCENARIOS = [[1, 0, 1, 0, 0], [1, 0, 1, 256, 0], [0, 1, 0, 0, 0], [0, 1, 1, 256, 0], [0, 0, 1, 0, 1],
                      [0, 0, 1, 0, 2]]
# When a backward reduces, which DDP decides at forward: each iteration a first pass of the kind
# below, then an ordinary one, the gradients recorded after each. [gradient_as_bucket_view, kind:
# 1: forward under no_sync(), backward after it (no reduction); 2: forward before no_sync(),
# backward under it (reduces); 3: two backward passes of one forward (retain_graph: the second
# adds local gradients); 4: a forward of the module itself, bypassing DDP (no reduction)]
DDP_SYNC_SCENARIOS = [[0, 1], [1, 1], [0, 2], [1, 2], [0, 3], [1, 3], [0, 4], [1, 4]]


# Parameters in other memory layouts: a convolution whose weight is channels_last (as
# model.to(memory_format=torch.channels_last) leaves it), fed channels_last batches, and a
# parameter stored transposed. DDP's bucket views follow each parameter's strides, and the
# gradients keep them; with gradient_as_bucket_view they are views of the buckets (how many
# storages the gradients use is compared where the buckets are the default: one bucket here).
# [gradient_as_bucket_view, bucket bytes (0: DDP's default)]
DDP_LAYOUT_SCENARIOS = [[0, 0], [1, 0], [0, 256], [1, 256]]


# Sparse gradients: an Embedding with sparse=True (DDP keeps its weight out of the buckets and
# reduces it by gloo's sparse allreduce) before a Linear; each rank looks up ids of its own, some
# shared. [find_unused_parameters, gradient_as_bucket_view, backward passes per step (k - 1 under
# no_sync())]
DDP_SPARSE_SCENARIOS = [[0, 0, 1], [0, 1, 1], [1, 0, 1], [0, 0, 2]]


def sparse_model():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(12, 3, sparse=True)
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, ids):
            return self.fc(self.emb(ids).mean(1))

    torch.manual_seed(32)
    return Net().double()


def ddp_sparse(rank, world, tensors):
    """DDP_SPARSE_SCENARIOS: each rank's gradients (dense values, and whether sparse) after each
    step's passes, its state after each step (SGD with momentum)."""
    for s, (unused, as_view, passes) in enumerate(DDP_SPARSE_SCENARIOS):
        model = sparse_model()
        names = [n for n, _ in model.named_parameters()]
        for n, t in model.state_dict().items():
            tensors[f"e{s}.init.{n}"] = t.clone()
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=bool(unused),
                                                        gradient_as_bucket_view=bool(as_view))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(5000 * world + 10 * rank + s)
        for it in range(DDP_ITERATIONS):
            p = f"e{s}.{it}."
            opt.zero_grad(set_to_none=True)
            for k in range(passes):
                ids = torch.randint(0, 12, (DDP_BATCH, 3), generator=gen)
                target = torch.randn(DDP_BATCH, 2, generator=gen, dtype=torch.float64)
                tensors[f"{p}{k}.ids"], tensors[f"{p}{k}.target"] = ids, target
                if k + 1 < passes:
                    with ddp.no_sync():
                        torch.nn.functional.mse_loss(ddp(ids), target).backward()
                else:
                    torch.nn.functional.mse_loss(ddp(ids), target).backward()
            params = dict(model.named_parameters())
            for n in names:
                g = params[n].grad
                tensors[f"{p}grad.{n}"] = g.to_dense().clone() if g.is_sparse else g.clone()
                tensors[f"{p}grad_sparse.{n}"] = torch.tensor([int(g.is_sparse)], dtype=torch.int64)
            opt.step()
            for n, t in model.state_dict().items():
                tensors[f"{p}state.{n}"] = t.clone()


def layout_model():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)  # BatchNorm follows (see ddp_model)
            self.bn = torch.nn.BatchNorm2d(4)
            self.fc = torch.nn.Linear(4 * 5 * 5, 6)
            self.proj = torch.nn.Parameter(torch.randn(6, 2))

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x)))
            return self.fc(h.flatten(1)) @ self.proj

    torch.manual_seed(31)
    net = Net().double().to(memory_format=torch.channels_last)
    net.proj.data = net.proj.data.t().contiguous().t()  # the same values, strides (1, 6)
    assert net.conv.weight.is_contiguous(memory_format=torch.channels_last) and not net.proj.is_contiguous()
    return net


def ddp_layouts(rank, world, tensors):
    """DDP_LAYOUT_SCENARIOS: each rank's gradients (values and strides) after each backward, its
    state after each step."""
    for s, (as_view, bucket) in enumerate(DDP_LAYOUT_SCENARIOS):
        model = layout_model()
        names = [n for n, _ in model.named_parameters()]
        for n, t in model.state_dict().items():
            tensors[f"l{s}.init.{n}"] = t.clone()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, gradient_as_bucket_view=bool(as_view), **({"bucket_cap_mb": bucket / 2 ** 20} if bucket else {}))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(4000 * world + 10 * rank + s)
        for it in range(DDP_ITERATIONS):
            p = f"l{s}.{it}."
            opt.zero_grad(set_to_none=False)
            x = torch.randn(DDP_BATCH, 3, 5, 5, generator=gen, dtype=torch.float64)
            target = torch.randn(DDP_BATCH, 2, generator=gen, dtype=torch.float64)
            tensors[p + "x"], tensors[p + "target"] = x, target
            y = ddp(x.contiguous(memory_format=torch.channels_last))
            torch.nn.functional.mse_loss(y, target).backward()
            params = dict(model.named_parameters())
            for n in names:
                tensors[f"{p}grad.{n}"] = params[n].grad.clone()
                tensors[f"{p}grad_strides.{n}"] = torch.tensor(params[n].grad.stride(), dtype=torch.int64)
            # With gradient_as_bucket_view the gradients are views of their buckets' storage.
            storages = {getattr(params[n].grad, "untyped_storage", params[n].grad.storage)().data_ptr() for n in names}
            tensors[p + "grad_storages"] = torch.tensor([len(storages)], dtype=torch.int64)
            opt.step()
            for n, t in model.state_dict().items():
                tensors[f"{p}state.{n}"] = t.clone()


def ddp_model():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 8, bias=False)  # BatchNorm follows: a bias would get 0 up to rounding
            self.bn = torch.nn.BatchNorm1d(8)
            self.fc2 = torch.nn.Linear(8, 4)
            self.extra = torch.nn.Linear(8, 4)   # used by rank 1 only
            self.unused = torch.nn.Linear(4, 4)  # used by no rank

        def forward(self, x, use_extra):
            h = torch.relu(self.bn(self.fc1(x)))
            y = self.fc2(h)
            return y + self.extra(h) if use_extra else y

    torch.manual_seed(30)
    return Net().double()


def ddp_rank(rank, world):
    tensors = {}
    for s, (unused, bucket, as_view, to_none, passes) in enumerate(DDP_SCENARIOS):
        model = ddp_model()
        names = [n for n, _ in model.named_parameters()]
        for n, t in model.state_dict().items():
            tensors[f"{s}.init.{n}"] = t.clone()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, find_unused_parameters=bool(unused), gradient_as_bucket_view=bool(as_view),
            **({"bucket_cap_mb": bucket / 2 ** 20} if bucket else {}))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(1000 * world + 10 * rank + s)
        for it in range(DDP_ITERATIONS):
            p = f"{s}.{it}."
            opt.zero_grad(set_to_none=bool(to_none))
            for k in range(passes):
                x = torch.randn(DDP_BATCH, 6, generator=gen, dtype=torch.float64)
                target = torch.randn(DDP_BATCH, 4, generator=gen, dtype=torch.float64)
                tensors[f"{p}{k}.x"], tensors[f"{p}{k}.target"] = x, target
                if k + 1 < passes:
                    with ddp.no_sync():
                        torch.nn.functional.mse_loss(ddp(x, rank == 1), target).backward()
                else:
                    torch.nn.functional.mse_loss(ddp(x, rank == 1), target).backward()
            params = dict(model.named_parameters())
            tensors[p + "grad_defined"] = torch.tensor([params[n].grad is not None for n in names], dtype=torch.int64)
            for n in names:
                if params[n].grad is not None:
                    tensors[f"{p}grad.{n}"] = params[n].grad.clone()
            opt.step()
            for n, t in model.state_dict().items():
                tensors[f"{p}state.{n}"] = t.clone()
    ddp_more(rank, world, tensors)
    ddp_sync(rank, world, tensors)
    ddp_layouts(rank, world, tensors)
    ddp_sparse(rank, world, tensors)
    save(f"ddp.{world}.{rank}", tensors)


def record_gradients(tensors, p, model):
    names = [n for n, _ in model.named_parameters()]
    params = dict(model.named_parameters())
    tensors[p + "grad_defined"] = torch.tensor([params[n].grad is not None for n in names], dtype=torch.int64)
    for n in names:
        if params[n].grad is not None:
            tensors[f"{p}grad.{n}"] = params[n].grad.clone()


def ddp_more(rank, world, tensors):
    """DDP_MORE_SCENARIOS: each rank's gradients and state after each of its iterations, and after
    the Join (its post-hook gives every rank the last joiner's parameters and buffers)."""
    from torch.distributed.algorithms.join import Join
    for s, (join, static, unused, bucket, early) in enumerate(DDP_MORE_SCENARIOS):
        model = ddp_model()
        for n, t in model.state_dict().items():
            tensors[f"j{s}.init.{n}"] = t.clone()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, find_unused_parameters=bool(unused), static_graph=bool(static),
            **({"bucket_cap_mb": bucket / 2 ** 20} if bucket else {}))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(2000 * world + 10 * rank + s)
        with Join([ddp], enable=bool(join)):
            for it in range(1 if join and rank == world - 1 else DDP_ITERATIONS):
                p = f"j{s}.{it}."
                opt.zero_grad(set_to_none=True)  # the default from PyTorch 2.0; 1.13's was False
                if early:
                    x = torch.randn(DDP_BATCH, 6, generator=gen, dtype=torch.float64)
                    target = torch.randn(DDP_BATCH, 4, generator=gen, dtype=torch.float64)
                    tensors[p + "early.x"], tensors[p + "early.target"] = x, target
                    with ddp.no_sync():
                        torch.nn.functional.mse_loss(ddp(x, rank == 0), target).backward()
                x = torch.randn(DDP_BATCH, 6, generator=gen, dtype=torch.float64)
                target = torch.randn(DDP_BATCH, 4, generator=gen, dtype=torch.float64)
                tensors[p + "x"], tensors[p + "target"] = x, target
                torch.nn.functional.mse_loss(ddp(x, rank == 1 and early != 1), target).backward()
                record_gradients(tensors, p, model)
                opt.step()
                for n, t in model.state_dict().items():
                    tensors[f"{p}state.{n}"] = t.clone()
        record_gradients(tensors, f"j{s}.final.", model)
        for n, t in model.state_dict().items():
            tensors[f"j{s}.final.state.{n}"] = t.clone()


def ddp_sync(rank, world, tensors):
    """DDP_SYNC_SCENARIOS: each rank's gradients after each pass, its state after each step."""
    for s, (as_view, kind) in enumerate(DDP_SYNC_SCENARIOS):
        model = ddp_model()
        for n, t in model.state_dict().items():
            tensors[f"s{s}.init.{n}"] = t.clone()
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True,
                                                        gradient_as_bucket_view=bool(as_view))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(3000 * world + 10 * rank + s)
        for it in range(DDP_ITERATIONS):
            p = f"s{s}.{it}."
            opt.zero_grad(set_to_none=True)
            for k in range(2):
                x = torch.randn(DDP_BATCH, 6, generator=gen, dtype=torch.float64)
                target = torch.randn(DDP_BATCH, 4, generator=gen, dtype=torch.float64)
                tensors[f"{p}{k}.x"], tensors[f"{p}{k}.target"] = x, target
                loss = lambda y: torch.nn.functional.mse_loss(y, target)
                if k == 1:
                    loss(ddp(x, rank == 1)).backward()
                elif kind == 1:
                    with ddp.no_sync():
                        y = ddp(x, rank == 1)
                    loss(y).backward()
                elif kind == 2:
                    y = ddp(x, rank == 1)
                    with ddp.no_sync():
                        loss(y).backward()
                elif kind == 3:
                    l = loss(ddp(x, rank == 1))
                    l.backward(retain_graph=True)
                    l.backward()
                else:
                    loss(model(x, rank == 1)).backward()
                record_gradients(tensors, f"{p}{k}.", model)
            opt.step()
            for n, t in model.state_dict().items():
                tensors[f"{p}state.{n}"] = t.clone()


# herd::distributed_optimizer over herd::torch_gradients at 2 and 3 ranks against what PyTorch's
# own optimizers do with the ranks' averaged gradients: a gradient that no rank produced stays
# None, and the optimizer skips that parameter, so that neither momentum nor weight decay moves
# it. The model of the DDP checks; `extra` is used by rank 1 in the first iteration only, `unused`
# by no rank. Each rank's gradients are computed here one after the other on one model (in
# training, BatchNorm normalizes with the batch's own statistics, so the running ones, which this
# sharing mixes, do not enter the gradients; they are not compared).
# [0 (SGD), lr, momentum, weight_decay] or [1 (AdamW), lr, beta1, weight_decay]
UNUSED_CASES = [[0, 0.1, 0.9, 0.01], [1, 0.01, 0.9, 0.1]]


def unused_gradients_check():
    tensors = {"cases": torch.tensor(UNUSED_CASES, dtype=torch.float64),
               "shape": torch.tensor([DDP_ITERATIONS, DDP_BATCH], dtype=torch.int64)}
    for world in (2, 3):
        for c, (kind, lr, beta, decay) in enumerate(UNUSED_CASES):
            p0 = f"{world}.{c}."
            model = ddp_model()
            for n, t in model.state_dict().items():
                tensors[f"{p0}init.{n}"] = t.clone()
            if kind == 0:
                opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=beta, weight_decay=decay)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(beta, 0.999), weight_decay=decay)
            params = dict(model.named_parameters())
            gen = torch.Generator().manual_seed(3000 * world + c)
            for it in range(DDP_ITERATIONS):
                p = f"{p0}{it}."
                sums = {}
                for rank in range(world):
                    x = torch.randn(DDP_BATCH, 6, generator=gen, dtype=torch.float64)
                    target = torch.randn(DDP_BATCH, 4, generator=gen, dtype=torch.float64)
                    tensors[f"{p}{rank}.x"], tensors[f"{p}{rank}.target"] = x, target
                    model.zero_grad(set_to_none=True)
                    torch.nn.functional.mse_loss(model(x, rank == 1 and it == 0), target).backward()
                    for n, q in params.items():
                        if q.grad is not None:
                            sums[n] = q.grad.clone() if n not in sums else sums[n] + q.grad
                for n, q in params.items():
                    q.grad = sums[n] / world if n in sums else None
                tensors[p + "grad_defined"] = torch.tensor([n in sums for n in params], dtype=torch.int64)
                opt.step()
                for n, q in params.items():
                    tensors[f"{p}state.{n}"] = q.detach().clone()
    save("unused_gradients", tensors)


# ZeRO-1: torch.distributed.optim.ZeroRedundancyOptimizer (gloo) at 2 and 3 ranks; herd's
# zero_optimizer runs under mpiexec on the same inputs. Each rank has its own gradients at each
# step; the ranks average them (a sum over gloo, then a division by the ranks, as herd's avg does)
# before each step. The parameters have uneven sizes, so that herd's equal flat shards cut through
# parameters (at 2 ranks: 25 and 24 elements; at 3: 17, 17 and 15) while PyTorch assigns whole
# parameters to ranks; the second one starts at 0.
ZERO_SIZES = (23, 7, 1, 13, 5)
ZERO_STEPS = 20
# [0 (SGD), lr, momentum, dampening, nesterov, weight_decay] or [1 (AdamW), lr, beta1, beta2, eps, weight_decay]
ZERO_CASES = [[0, 0.05, 0.9, 0, 0, 0.01], [0, 0.02, 0.8, 0, 1, 0.05], [1, 1e-3, 0.9, 0.999, 1e-8, 1e-2],
              [1, 0.01, 0.8, 0.95, 1e-6, 0.1]]


# fp16 ZeRO-1, as DeepSpeed's: f16 parameters with f32 master weights. PyTorch's side does what
# DeepSpeed does with the real torch.optim: f32 copies of the f16 parameters (the masters),
# stepped by ZeroRedundancyOptimizer over torch.optim.SGD or AdamW with the f32 average of the
# ranks' f16 gradients, then rounded to f16 (.half()). Each rank's f16 gradient is W k 2^-16,
# |k| <= 256 an integer: divided by W before the sum (herd's average of 16-bit gradients), summed
# over up to 3 ranks in f16 and cast to f32, or cast to f32, divided and summed there (here),
# every value is exact, so both averages are the same bits. The learning rates make most updates
# smaller than half an f16 step of their weight, which f16 parameters stepped themselves lose.
ZERO_HALF_CASES = [[0, 0.02, 0.9, 0, 0, 0], [1, 2e-4, 0.9, 0.999, 1e-8, 1e-2]]


def zero_half_inputs(world, case):
    """f16 initial parameters (the second one 0), and each rank's f16 gradients ([rank, step, element])."""
    gen = torch.Generator().manual_seed(2000 * world + case)
    init = [torch.zeros(n, dtype=torch.float16) if k == 1 else torch.randn(n, generator=gen, dtype=torch.float64).half()
            for k, n in enumerate(ZERO_SIZES)]
    grads = [(torch.randint(-256, 257, (world, ZERO_STEPS, n), generator=gen, dtype=torch.int64).double() * world
              * 2.0 ** -16).half() for n in ZERO_SIZES]
    return init, grads


def zero_inputs(world, case):
    """f32 initial parameters, and each rank's gradients at each step ([rank, step, element]).
    Each element's values over the ranks lie on a grid of 2^-21 of the largest of them: every
    partial sum of up to 3 of them is then exact in f32, so the average's bits do not depend on the
    order in which gloo or herd add (only the final division rounds)."""
    gen = torch.Generator().manual_seed(1000 * world + case)
    init = [torch.zeros(n) if k == 1 else torch.randn(n, generator=gen, dtype=torch.float64).float()
            for k, n in enumerate(ZERO_SIZES)]
    grads = []
    for n in ZERO_SIZES:
        g = torch.randn(world, ZERO_STEPS, n, generator=gen, dtype=torch.float64)
        quantum = torch.exp2(torch.ceil(torch.log2(g.abs().amax(0))) - 21)
        grads.append((torch.round(g / quantum) * quantum).float())
    return init, grads


def zero_optimizer(params, kind, o):
    """ZeroRedundancyOptimizer over torch.optim.SGD (kind 0) or AdamW, with an options row's hyperparameters."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    if kind == 0:
        return ZeroRedundancyOptimizer(params, torch.optim.SGD, lr=o[0], momentum=o[1], dampening=o[2],
                                       nesterov=bool(o[3]), weight_decay=o[4])
    return ZeroRedundancyOptimizer(params, torch.optim.AdamW, lr=o[0], betas=(o[1], o[2]), eps=o[3], weight_decay=o[4])


def zero_rank(rank, world):
    import torch.distributed as dist
    tensors = {"cases": torch.tensor([len(ZERO_CASES)], dtype=torch.int64), "sqrt_correctly_rounded": sqrt_correctly_rounded()}
    for c, (kind, *o) in enumerate(ZERO_CASES):
        init, grads = zero_inputs(world, c)
        params = [p.clone().requires_grad_() for p in init]
        opt = zero_optimizer(params, kind, o)
        trajectory = [torch.empty(ZERO_STEPS, n) for n in ZERO_SIZES]
        for s in range(ZERO_STEPS):
            flat = torch.cat([g[rank, s] for g in grads])
            dist.all_reduce(flat)
            flat.div_(world)
            for p, g in zip(params, flat.split(ZERO_SIZES)):
                p.grad = g.clone()
            opt.step()
            for k, p in enumerate(params):
                trajectory[k][s] = p.detach()
        tensors[f"{c}.options"] = torch.tensor([kind, *o], dtype=torch.float64)
        for k in range(len(ZERO_SIZES)):
            tensors[f"{c}.init.{k}"] = init[k]
            tensors[f"{c}.grads.{k}"] = grads[k][rank]
            tensors[f"{c}.torch.{k}"] = trajectory[k]
    tensors["half_cases"] = torch.tensor([len(ZERO_HALF_CASES)], dtype=torch.int64)
    for c, (kind, *o) in enumerate(ZERO_HALF_CASES):
        init, grads = zero_half_inputs(world, c)
        masters = [p.float().requires_grad_() for p in init]
        opt = zero_optimizer(masters, kind, o)
        trajectory = [torch.empty(ZERO_STEPS, n, dtype=torch.float16) for n in ZERO_SIZES]
        master_trajectory = [torch.empty(ZERO_STEPS, n) for n in ZERO_SIZES]
        for s in range(ZERO_STEPS):
            flat = torch.cat([g[rank, s] for g in grads]).float().div_(world)
            dist.all_reduce(flat)
            for m, g in zip(masters, flat.split(ZERO_SIZES)):
                m.grad = g.clone()
            opt.step()
            for k, m in enumerate(masters):
                master_trajectory[k][s] = m.detach()
                trajectory[k][s] = m.detach().half()
        tensors[f"h{c}.options"] = torch.tensor([kind, *o], dtype=torch.float64)
        for k in range(len(ZERO_SIZES)):
            tensors[f"h{c}.init.{k}"] = init[k]
            tensors[f"h{c}.grads.{k}"] = grads[k][rank]
            tensors[f"h{c}.torch.{k}"] = trajectory[k]
            tensors[f"h{c}.master.{k}"] = master_trajectory[k]
    save(f"zero.{world}.{rank}", tensors)


def distributed_rank(world):
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ddp_rank(rank, world)
    zero_rank(rank, world)
    dist.destroy_process_group()
    # ZeroRedundancyOptimizer broadcasts parameters that have Python objects, and the process group
    # outlives destroy_process_group here: a gloo worker that drops the last work's tensors after the
    # interpreter has begun to finalize needs the GIL, and a thread that takes it then is ended by
    # force, which aborts the process ("terminate called without an active exception"), now and
    # then. The files are written and closed: leave without finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def distributed_checks():
    import socket
    import subprocess
    for world in (2, 3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ranks = []
        for rank in range(world):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
            ranks.append(subprocess.Popen([sys.executable, __file__, "--rank", "all", str(world), out], env=env))
        if any(r.wait(timeout=120) != 0 for r in ranks):
            sys.exit(f"parity: torch DDP or ZeroRedundancyOptimizer at {world} ranks failed")
    tensors = {"scenarios": torch.tensor(DDP_SCENARIOS, dtype=torch.int64),
               "more_scenarios": torch.tensor(DDP_MORE_SCENARIOS, dtype=torch.int64),
               "sync_scenarios": torch.tensor(DDP_SYNC_SCENARIOS, dtype=torch.int64),
               "layout_scenarios": torch.tensor(DDP_LAYOUT_SCENARIOS, dtype=torch.int64),
               "sparse_scenarios": torch.tensor(DDP_SPARSE_SCENARIOS, dtype=torch.int64),
               "shape": torch.tensor([DDP_ITERATIONS, DDP_BATCH], dtype=torch.int64)}
    save("ddp", tensors)


if RANK_PROCESS:
    distributed_rank(int(sys.argv[3]))
else:
    run_checks()
