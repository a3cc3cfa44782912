#!/usr/bin/env python3
"""herd checkpoints and the safetensors package, both ways.

  check_safetensors.py PROGRAM WORK_DIR

PROGRAM (checkpoint_interop.cpp) writes WORK_DIR/herd.safetensors; this script reads it with
safetensors.torch and safetensors' numpy API and checks every value bit for bit, and herd's
metadata and checksum; then it writes WORK_DIR/torch.safetensors with safetensors.torch.save_file
and PROGRAM loads that into herd tensors by name and checks it. The values are generation k of
formulas that PROGRAM computes too. Where PROGRAM was built with Eigen, the file also holds
"eigen" (a column-major Eigen::MatrixXf) and "eigen.row_major", 3x2 with M(i, j) = 10 i + j + 100 k:
Python must read t[i][j] == M(i, j), and herd must load PyTorch's [3, 2] tensor as that matrix.

Exits 77 (skipped) when torch or numpy cannot be imported, or safetensors can be neither imported
nor fetched: when it is missing, its wheel is fetched from PyPI once (pip download, any pip on the
machine) and unpacked into WORK_DIR/python, which goes on sys.path.
"""
import glob
import importlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile

SKIP = 77


def skip(why):
    print(f"checkpoint_python_interop: skipped: {why}")
    sys.exit(SKIP)


def import_safetensors(folder):
    sys.path.append(folder)
    try:
        return importlib.import_module("safetensors.torch")
    except ImportError:
        pass
    wheels = os.path.join(folder, "wheels")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    problems = []
    for pip in ([sys.executable, "-m", "pip"], [shutil.which("pip3")], [shutil.which("pip")]):
        if None in pip:
            continue
        command = pip + ["download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", version,
                         "--timeout", "15", "--retries", "1", "--dest", wheels, "safetensors"]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            problems.append(f"{pip[0]}: {e}")
            continue
        found = sorted(glob.glob(os.path.join(wheels, "safetensors-*.whl")))
        if result.returncode == 0 and found:
            with zipfile.ZipFile(found[-1]) as wheel:  # a wheel of compiled code only: its root is the package
                wheel.extractall(folder)
            importlib.invalidate_caches()
            break
        problems.append(f"{' '.join(pip)}: {(result.stderr.strip().splitlines() or ['failed'])[-1]}")
        if "No module named pip" not in result.stderr:
            break  # a pip that ran and failed: another would not reach PyPI either
    try:
        return importlib.import_module("safetensors.torch")
    except ImportError as e:
        skip(f"cannot import safetensors ({e}); fetching it from PyPI failed: {'; '.join(problems) or 'no pip'}")


def matrix(k, torch):
    """Generation k of checkpoint_interop.cpp's Eigen matrices: t[i][j] = 10 i + j + 100 k."""
    return torch.tensor([[10.0 * i + j + 100 * k for j in range(2)] for i in range(3)], dtype=torch.float32)


def expected(k, np, torch, eigen=False):
    """Generation k of the values checkpoint_interop.cpp writes and checks."""
    j = np.arange
    matrices = {"eigen": matrix(k, torch), "eigen.row_major": matrix(k, torch)} if eigen else {}
    special = np.array([0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x7FC00001, 0x7F7FFFFF], np.uint32)
    return {
        "f32": torch.from_numpy((j(6) * 0.75 - 2.5 + k).astype(np.float32).reshape(2, 3)),
        "f32.special": torch.from_numpy(special.view(np.float32)),
        "f64": torch.from_numpy(1.0 / (j(5) + 3) + k),
        "f16": torch.from_numpy((j(12) * 0.5 - 3 + k).astype(np.float16).reshape(3, 2, 2)),
        "bf16": torch.tensor(j(4) * -1.25 + 0.5 + k, dtype=torch.bfloat16),
        "i32": torch.from_numpy((j(4) * -100003 - 7 + k).astype(np.int32).reshape(2, 2)),
        "i64": torch.from_numpy(((j(3) - 1) * (1 << 40) + k).astype(np.int64)),
        "u8": torch.from_numpy(((j(7) * 37 + k) % 256).astype(np.uint8)),
        "i8": torch.from_numpy((j(4) * -30 + 5 + k).astype(np.int8)),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
        "scale": torch.tensor([0.125 * (k + 1)], dtype=torch.float64),
        "step": torch.tensor(list((123456789 + k).to_bytes(8, "little")), dtype=torch.uint8),
        **matrices,
    }


def bits(tensor, torch):
    return (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy().tobytes()


def fnv1a64(data):
    state = 14695981039346656037
    for byte in data:
        state = ((state ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return state


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    program, work = sys.argv[1], sys.argv[2]
    try:
        import numpy as np
        import torch
    except ImportError as e:
        skip(f"{e} (Debian: python3-torch)")
    st_torch = import_safetensors(os.path.join(work, "python"))
    from safetensors import safe_open
    import safetensors

    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    # herd -> Python
    herd_path = os.path.join(work, "herd.safetensors")
    subprocess.run([program, "write", herd_path], check=True)
    got = st_torch.load_file(herd_path)
    eigen = "eigen" in got
    want = expected(0, np, torch, eigen)
    if eigen:  # said element by element, as the reason this entry exists
        t = got["eigen"]
        for i in range(3):
            for j in range(2):
                check(t.shape == (3, 2) and t[i][j].item() == 10 * i + j,
                      f"eigen: t[{i}][{j}] is {t[i][j].item() if t.shape == (3, 2) else list(t.shape)}, "
                      f"herd's M({i}, {j}) is {10 * i + j}")
    check(sorted(got) == sorted(want), f"names: {sorted(got)}")
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            continue
        check(g.dtype == w.dtype and g.shape == w.shape, f"{name}: {g.dtype} {list(g.shape)}, expected {w.dtype} {list(w.shape)}")
        check(g.dtype == w.dtype and bits(g, torch) == bits(w, torch), f"{name}: {g} is not {w}")
    with safe_open(herd_path, framework="np") as f:
        metadata = f.metadata()
        for name, w in want.items():
            if w.dtype != torch.bfloat16:  # numpy has no bfloat16
                try:
                    a = f.get_tensor(name)
                    check(a.shape == tuple(w.shape) and a.tobytes() == w.numpy().tobytes(), f"{name} through numpy: {a}")
                except Exception as e:  # a dtype numpy cannot hold, where the file has the wrong one
                    check(False, f"{name} through numpy: {e}")
    check(metadata.get("herd.checkpoint") == "1", f"herd.checkpoint: {metadata}")
    check(json.loads(metadata.get("herd.values", "null")) == ["step"], f"herd.values: {metadata}")
    raw = open(herd_path, "rb").read()
    prefix = b'{"__metadata__":{"herd.checksum":"fnv1a64:'
    at = 8 + len(prefix)
    check(raw[8:at] == prefix, "the header does not start with herd.checksum")
    check(metadata.get("herd.checksum") == "fnv1a64:%016x" % fnv1a64(raw[:at] + b"0" * 16 + raw[at + 16:]),
          f"herd.checksum {metadata.get('herd.checksum')} is not FNV-1a 64 of the file with its digits as '0'")
    check(struct.unpack("<Q", raw[:8])[0] % 8 == 0, "the header does not end 8-aligned")

    # PyTorch -> herd: real shapes, a scalar where herd wrote one element
    torch_path = os.path.join(work, "torch.safetensors")
    tensors = expected(1, np, torch, eigen)
    tensors["scale"] = tensors["scale"].reshape(())
    st_torch.save_file(tensors, torch_path, metadata={"format": "pt"})
    loaded = subprocess.run([program, "read", torch_path])
    check(loaded.returncode == 0, f"checkpoint_interop read {torch_path} failed")

    for failure in failures:
        print(f"checkpoint_python_interop: {failure}", file=sys.stderr)
    print(f"checkpoint_python_interop: safetensors {safetensors.__version__}, torch {torch.__version__}: "
          f"{'FAILED' if failures else 'herd -> Python and PyTorch -> herd bit for bit'}"
          f"{', Eigen matrices included' if eigen else ', without Eigen'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
