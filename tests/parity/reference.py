#!/usr/bin/python3
"""PyTorch's results for herd's parity checks (tests/parity), written once per build.

  reference.py OUTDIR

For each check it writes OUTDIR/<check>.safetensors: the inputs (from a fixed seed) and what
PyTorch computes from them; herd's parity programs compute the same from those inputs and compare.
PyTorch runs its scalar CPU kernels (ATEN_CPU_CAPABILITY=default, set before torch is imported):
its vectorized kernels fuse a + alpha * b into one FMA where the machine has one, so their last
bit depends on the CPU; the scalar kernels round each operation, as herd does, and so can be
compared bit for bit. Without torch it writes OUTDIR/torch_missing and the checks are skipped.
"""
import json
import os
import struct
import sys

os.environ["ATEN_CPU_CAPABILITY"] = "default"
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
try:
    import torch
except ImportError as e:
    open(os.path.join(out, "torch_missing"), "w").write(f"torch is not importable: {e}\n")
    print(f"parity: torch is not importable ({e}); the parity checks are skipped")
    sys.exit(0)
if os.path.exists(os.path.join(out, "torch_missing")):
    os.remove(os.path.join(out, "torch_missing"))

ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.int8: "I8"}


def save(check, tensors):
    """A safetensors file (8-byte header length, JSON header, data), without the safetensors package."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        blob = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
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


def optimizer_check(check, cases, make):
    """Each case's options, inputs and PyTorch's parameters after every one of STEPS steps."""
    gen = torch.Generator().manual_seed(18)
    tensors = {"cases": torch.tensor([len(cases)], dtype=torch.int64)}
    for c, options in enumerate(cases):
        tensors[f"{c}.options"] = torch.tensor(options, dtype=torch.float64)
        for dtype, dn in ((torch.float32, "f32"), (torch.float64, "f64")):
            init, grads = optimizer_inputs(gen, dtype)
            params = [p.clone().requires_grad_() for p in init]
            opt = make(params, options)
            trajectory = [torch.empty(STEPS, n, dtype=dtype) for n in SIZES]
            for s in range(STEPS):
                for p, g in zip(params, grads):
                    p.grad = g[s].clone()
                opt.step()
                for k, p in enumerate(params):
                    trajectory[k][s] = p.detach()
            for k in range(len(SIZES)):
                tensors[f"{c}.{dn}.init.{k}"] = init[k]
                tensors[f"{c}.{dn}.grads.{k}"] = grads[k]
                tensors[f"{c}.{dn}.torch.{k}"] = trajectory[k]
    save(check, tensors)


# [lr, momentum, dampening, nesterov, weight_decay]
optimizer_check("sgd", [[0.1, 0, 0, 0, 0], [0.05, 0.9, 0, 0, 0], [0.05, 0.9, 0.25, 0, 0.01], [0.02, 0.8, 0, 1, 0.05]],
                lambda ps, o: torch.optim.SGD(ps, lr=o[0], momentum=o[1], dampening=o[2], nesterov=bool(o[3]),
                                              weight_decay=o[4]))
# [lr, beta1, beta2, eps, weight_decay]
optimizer_check("adamw", [[1e-3, 0.9, 0.999, 1e-8, 1e-2], [0.01, 0.8, 0.95, 1e-6, 0.1]],
                lambda ps, o: torch.optim.AdamW(ps, lr=o[0], betas=(o[1], o[2]), eps=o[3], weight_decay=o[4]))
