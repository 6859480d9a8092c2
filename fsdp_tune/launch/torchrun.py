"""Run a RankSpec through torchrun: write the spec the ranks read, start torchrun, relay stop requests.

torchrun is the distributed engine (standalone, static or c10d rendezvous, elastic restarts); this module
only builds its command line from the spec's World and watches it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.launch.failure import Outcome
from fsdp_tune.launch.spec import RankSpec
from fsdp_tune.launch.stopping import TORCHRUN_SIGNALS, StopRelay
from fsdp_tune.runfiles import (
    METRICS_NAME,
    PREVIOUS_METRICS_NAME,
    RUN_ID_ENV,
    STOP_FILE,
    SUMMARY_NAME,
    torchrun_log_dir,
    write_atomic,
)

# torchrun's default wait for every node to join (static and c10d rendezvous alike)
RENDEZVOUS_TIMEOUT_S = 600


def torchrun_args(spec: RankSpec) -> list[str]:
    w = spec.world
    args = [
        f"--nproc_per_node={w.nproc_per_node}",
        f"--max_restarts={w.max_restarts}",
        f"--log_dir={torchrun_log_dir(spec.output_dir)}",
        # forward SLURM's --signal USR1 too (the grace before torchrun kills the ranks: torchrun_env)
        f"--signals_to_handle={TORCHRUN_SIGNALS}",
    ]
    if w.standalone:
        args.append("--standalone")
    elif w.rdzv_backend == "static":
        args += [
            f"--nnodes={w.nnodes}",
            f"--node_rank={w.node_rank}",
            f"--master_addr={w.master_addr}",
            f"--master_port={w.master_port}",
        ]
    else:
        args += [
            f"--nnodes={w.nnodes}",
            f"--rdzv_backend={w.rdzv_backend}",
            f"--rdzv_endpoint={w.master_addr}:{w.master_port}",
            "--rdzv_id=fsdp-tune",
        ]
    return args


def torchrun_env(spec: RankSpec) -> dict[str, str]:
    """torchrun's own environment: the ranks get time to finish the step and the checkpoint before torchrun kills
    them on a stop signal, the same time their collectives wait. Said through TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
    which torch 2.13's torchrun reads when --shutdown_timeout is not given (launcher/api.py): torch 2.11's
    torchrun has no --shutdown_timeout and refuses the whole command line (its grace is a fixed 30 s)."""
    return {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(spec.timeout_s)}


def command(spec: RankSpec) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *torchrun_args(spec),
        "-m",
        "fsdp_tune.worker",
        spec.resolved_path,
    ]


def materialize_model(spec: RankSpec) -> RankSpec:
    """A builtin model's folder, built on first use; everything else is read as named."""
    from dataclasses import replace

    name = spec.model.name_or_path
    if not name.startswith("builtin:"):
        return spec
    from fsdp_tune.sources.builtin import materialize

    return replace(spec, model=replace(spec.model, name_or_path=str(materialize(name.removeprefix("builtin:")))))


def prepare(cfg: RunConfig, spec: RankSpec, run_id: str | None = None) -> RankSpec:
    """Materialise builtin models and write the rank spec (with the config it came from, for people)."""
    spec = materialize_model(spec)
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if spec.world.node_rank == 0:
        # a summary is this run's or none; an overwritten run's metrics are kept aside, a resumed run appends.
        # Node 0 only: on a shared filesystem the other nodes see the same folder.
        (out / SUMMARY_NAME).unlink(missing_ok=True)
        if not spec.resume_from_checkpoint and (out / METRICS_NAME).exists():
            (out / METRICS_NAME).replace(out / PREVIOUS_METRICS_NAME)
    resolved = {"run_id": run_id, "spec": spec.as_dict(), "config": cfg.as_dict()}
    write_atomic(spec.resolved_path, json.dumps(resolved, indent=2))
    return spec


def _die_with_parent() -> None:
    """In the torchrun child: get SIGTERM if the launcher dies (even by SIGKILL), so no ranks are orphaned
    by the new session. Linux only; elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run(spec: RankSpec, run_id: str | None = None, keep_fds: tuple[int, ...] = ()) -> Outcome:
    """Start torchrun and wait.

    torchrun runs in its own session so a terminal's Ctrl-C reaches only us; a stop request (see
    stopping.py) writes the stop file: every rank finishes its step, saves a checkpoint and exits.
    `keep_fds` stay open in torchrun (the output folder's lock lives as long as the run). torchrun's stderr
    passes through to ours, and its tail is kept for the failure report.
    """
    env = dict(os.environ, **spec.env, **torchrun_env(spec))
    if run_id:
        env[RUN_ID_ENV] = run_id
    stop_file = Path(spec.output_dir, STOP_FILE)
    stop_file.unlink(missing_ok=True)
    w = spec.world
    if w.nnodes > 1:
        # otherwise a machine whose launch failed looks, from the others, like a silent hang
        print(
            f"waiting for all {w.nnodes} machines to join at {w.master_addr}:{w.master_port} "
            f"(torchrun gives up after {RENDEZVOUS_TIMEOUT_S} s if one never starts)",
            file=sys.stderr,
            flush=True,
        )
    relay = StopRelay(stop_file).install()  # before torchrun exists: a signal now is a stop request too
    tail = bytearray()
    reader = None
    try:
        proc = subprocess.Popen(
            command(spec),
            env=env,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            pass_fds=keep_fds,
        )
        relay.pid = proc.pid
        reader = threading.Thread(target=_pump, args=(proc, tail), daemon=True)
        reader.start()
        code = proc.wait()
    finally:
        relay.restore()
        if reader is not None:
            reader.join(timeout=5)
        stop_file.unlink(missing_ok=True)
    return Outcome(code, relay.signal, tail.decode("utf-8", "replace"))


def _pump(proc: subprocess.Popen, tail: bytearray) -> None:
    """torchrun's stderr to ours, keeping the tail. When ours is gone (`2>&1 | head` exited), keep reading:
    a full pipe would block torchrun and the ranks on their next write."""
    assert proc.stderr is not None
    out = sys.stderr.buffer
    while chunk := os.read(proc.stderr.fileno(), 65536):
        if out is not None:
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):
                out = None
        tail.extend(chunk)
        del tail[:-65536]
