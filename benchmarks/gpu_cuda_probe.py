"""The probe's device stages: what has never run in the lent machine's sandbox, each bounded, in processes of the
probe's own (the check's process must not hold a CUDA context beside the runs), before any model:

  context   CUDA as torch sees it: the context's creation timed, the card, its free memory
  matmul    bf16 matmuls timed: the dense peak this card reaches (the ceiling MFU is read against)
  pinned    page-locked host memory (cpu_offload keeps FSDP's shards there) and its copies to and from the GPU
  nccl      the "cuda:nccl,cpu:gloo" process group cpu_offload runs, in one process: an all-reduce on each
  bnb       bitsandbytes' 4-bit kernels: NF4 (nested) quantize/dequantize, a Linear4bit forward and backward

`python -m benchmarks.gpu_cuda_probe DEVICE STAGE...` prints one JSON line per stage as it starts and as it ends.
run_stages() reads them as they come, and a stage that does not end within its bound is reported hung and its
process group ended; the stages after it run in a new process (all but `context`'s dependants). On CPU
(--cpu-smoke) the same stages run where they can (gloo for nccl, bitsandbytes' CPU kernels), so the runner itself
is rehearsed.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

STAGES = ("context", "matmul", "pinned", "nccl", "bnb")
STAGE_CAP_S = 45.0


def _context(device: str) -> str:
    import torch

    if device != "cuda":
        return f"no CUDA here (torch {torch.__version__}): the CPU stages only"
    started = time.time()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    name, cap = torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)
    return (
        f"{name} (sm_{cap[0]}{cap[1]}), CUDA {torch.version.cuda}, context in {time.time() - started:.1f} s, "
        f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free"
    )


def _matmul(device: str) -> str:
    import torch

    n = 8192 if device == "cuda" else 256
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    _sync(device)
    reps, started = (20 if device == "cuda" else 3), time.time()
    for _ in range(reps):
        c = a @ b
    _sync(device)
    seconds = time.time() - started
    assert torch.isfinite(c.float()).all(), "bf16 matmul gave non-finite values"
    return f"{2 * n**3 * reps / seconds / 1e12:.1f} TFLOP/s dense bf16 ({reps} x {n}^3)"


def _pinned(device: str) -> str:
    import torch

    if device != "cuda":
        return "skipped: page-locked memory needs a GPU"
    host = torch.empty(256 * 2**20, dtype=torch.uint8, pin_memory=True)
    assert host.is_pinned(), "pin_memory=True gave pageable memory"
    gpu = torch.empty_like(host, device="cuda")
    started = time.time()
    gpu.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    h2d = time.time() - started
    started = time.time()
    host.copy_(gpu, non_blocking=True)
    torch.cuda.synchronize()
    d2h = time.time() - started
    return f"256 MiB pinned; to the GPU {0.25 / h2d:.1f} GiB/s, back {0.25 / d2h:.1f} GiB/s"


def _nccl(device: str) -> str:
    import datetime
    import socket

    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "cuda:nccl,cpu:gloo" if device == "cuda" else "cpu:gloo"
    store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        done = []
        for where in ["cuda", "cpu"] if device == "cuda" else ["cpu"]:
            t = torch.ones(1024, device=where)
            dist.all_reduce(t)
            _sync(where)
            assert float(t[0]) == 1.0, f"all-reduce on {where} gave {float(t[0])}"
            done.append(where)
        version = torch.cuda.nccl.version() if device == "cuda" else "-"
        version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    finally:
        dist.destroy_process_group()
    return f"{backend}: all-reduce on {' and '.join(done)} ok (NCCL {version})"


def _bnb(device: str) -> str:
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf
    import torch

    torch.manual_seed(0)
    w = torch.randn(512, 256, device=device, dtype=torch.bfloat16)
    packed, state = bnbf.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    back = bnbf.dequantize_4bit(packed, state)
    err = ((back.float() - w.float()).norm() / w.float().norm()).item()
    assert err < 0.15, f"NF4 round trip off by {err:.1%}"
    layer = bnb.nn.Linear4bit(256, 512, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(w.cpu(), requires_grad=False, quant_type="nf4")
    layer = layer.to(device)
    x = torch.randn(8, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.float().sum().backward()
    want = x.detach().float() @ bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float().t()
    off = ((y.detach().float() - want).norm() / want.norm()).item()
    assert off < 2e-2 and x.grad is not None and torch.isfinite(x.grad).all(), f"Linear4bit off by {off:.1%}"
    return f"bitsandbytes {bnb.__version__}: NF4 round trip {err:.1%}, Linear4bit forward {off:.1e} off, backward ok"


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def main(device: str, stages: list[str]) -> None:
    for name in stages:
        print(json.dumps({"stage": name, "event": "start"}), flush=True)
        started = time.time()
        try:
            detail, ok = globals()[f"_{name}"](device), True
        except Exception as err:  # noqa: BLE001 - whatever the stage raised is its finding
            detail, ok = f"{type(err).__name__}: {err}", False
        print(
            json.dumps(
                {"stage": name, "event": "end", "ok": ok, "seconds": round(time.time() - started, 2), "detail": detail}
            ),
            flush=True,
        )


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_stages(device: str, stages=STAGES, cap_s: float = STAGE_CAP_S, cmd: list[str] | None = None) -> list[dict]:
    """Every stage's record ({"stage", "ok", "seconds", "detail"}), each bounded by cap_s: a stage that hangs is
    reported and its process group ended, and the stages after it go on in a new process (none after a failed
    CUDA context). Never raises for what a stage did. `cmd` replaces the probe's command (tests)."""
    from benchmarks.gpu_proc import end_group

    left, found = list(stages), []
    while left:
        argv = [*(cmd or [sys.executable, "-m", "benchmarks.gpu_cuda_probe"]), device]
        proc = subprocess.Popen(
            [*argv, *left],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        current, deadline, said = None, time.time() + cap_s, []
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.time(), 0.01))
            except queue.Empty:  # the current stage (or the start) ran past its bound
                end_group(proc)
                name = current or left[0]
                found.append(
                    {
                        "stage": name,
                        "ok": False,
                        "seconds": cap_s,
                        "detail": f"hung: no answer in {cap_s:.0f} s; its processes ended",
                    }
                )
                left = left[left.index(name) + 1 :]
                break
            if line is None:  # the process ended
                proc.wait()
                if current:  # it died inside a stage
                    last = said[-1] if said else "no words"
                    found.append(
                        {"stage": current, "ok": False, "seconds": 0.0, "detail": f"exit {proc.returncode}: {last}"}
                    )
                    left = left[left.index(current) + 1 :]
                else:
                    left = []
                break
            try:
                event = json.loads(line)
            except ValueError:
                said.append(line.strip()) if line.strip() else None  # a library's print, a traceback
                continue
            if event.get("event") == "start":
                current, deadline = event["stage"], time.time() + cap_s
            elif event.get("event") == "end":
                found.append({k: event[k] for k in ("stage", "ok", "seconds", "detail")})
                left.remove(event["stage"])
                current, deadline = None, time.time() + cap_s
        if any(f["stage"] == "context" and not f["ok"] for f in found):
            found += [{"stage": n, "ok": False, "seconds": 0.0, "detail": "not run: no CUDA context"} for n in left]
            left = []
    return found


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
