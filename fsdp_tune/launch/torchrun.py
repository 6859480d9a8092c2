"""Run a RankSpec through torchrun: write the spec the ranks read, start torchrun, relay stop requests.

torchrun is the distributed engine (standalone, static or c10d rendezvous, elastic restarts); this module
only builds its command line from the spec's World and watches it.
"""

from __future__ import annotations

import codecs
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.launch.failure import Outcome
from fsdp_tune.launch.stopping import TORCHRUN_SIGNALS, StopRelay
from fsdp_tune.printable import printable
from fsdp_tune.redact import redact
from fsdp_tune.runfiles import (
    METRICS_NAME,
    PREVIOUS_METRICS_NAME,
    RUN_ID_ENV,
    STOP_FILE,
    torchrun_log,
    torchrun_log_dir,
    write_atomic,
)
from fsdp_tune.summary import ATTEMPT_ENV

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


def materialize_model(spec: RankSpec) -> None:
    """A builtin model's folder (the spec names it: decide/rank.py), built on first use; everything else is read
    as named."""
    name = spec.model.requested
    if not name.startswith("builtin:"):
        return
    from fsdp_tune.sources.builtin import materialize

    folder = str(materialize(name.removeprefix("builtin:")))
    if folder != spec.model.name_or_path:  # FSDP_TUNE_CACHE changed between deciding and launching
        raise RuntimeError(f"{name} was built into {folder}, not {spec.model.name_or_path} as the rank spec says")


def prepare(cfg: RunConfig, spec: RankSpec, run_id: str | None = None) -> RankSpec:
    """Materialise builtin models and write the rank spec (with the config it came from, for people)."""
    materialize_model(spec)
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if spec.world.node_rank == 0:
        # an overwritten run's metrics are kept aside, a resumed run appends. The summary stays until this
        # attempt writes its own (the launcher reads only its own attempt's): a resume that fails leaves the
        # finished run's summary as it was. Node 0 only: on a shared filesystem the other nodes see the same folder.
        if not spec.resume_from_checkpoint and (out / METRICS_NAME).exists():
            (out / METRICS_NAME).replace(out / PREVIOUS_METRICS_NAME)
    resolved = {"run_id": run_id, "spec": spec.as_dict(), "config": redact(cfg.as_dict())}  # secrets: not here
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


def run(
    spec: RankSpec,
    run_id: str | None = None,
    keep_fds: tuple[int, ...] = (),
    secret_env: dict[str, str] | None = None,
    attempt: str | None = None,
) -> Outcome:
    """Start torchrun and wait.

    torchrun runs in its own session so a terminal's Ctrl-C reaches only us; a stop request (see
    stopping.py) writes the stop file: every rank finishes its step, saves a checkpoint and exits.
    `keep_fds` stay open in torchrun (the output folder's lock lives as long as the run); `secret_env` (the
    push's HF_TOKEN) reaches the ranks' environment and no file. torchrun's stderr passes through to ours,
    and its tail is kept for the failure report.
    """
    # PET_<ARG> is torchrun's own spelling of its arguments: a scheduler's (Kubeflow's) would override what the
    # spec decided from them (schedulers/topology.py read them), so torchrun gets the spec's alone
    kept = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env = dict(kept, **spec.env, **torchrun_env(spec), **(secret_env or {}))
    if run_id:
        env[RUN_ID_ENV] = run_id
    if attempt:
        env[ATTEMPT_ENV] = attempt
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
    echo = spec.console == "verbose"  # otherwise torchrun's stderr goes to its log; the console gets the report
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
        log = torchrun_log(spec.output_dir)
        reader = threading.Thread(target=_pump, args=(proc, tail, log, echo), daemon=True)
        reader.start()
        code = proc.wait()
    finally:
        relay.restore()
        if reader is not None:
            reader.join(timeout=5)
        stop_file.unlink(missing_ok=True)
    return Outcome(code, relay.signal, tail.decode("utf-8", "replace"))


def _pump(proc: subprocess.Popen, tail: bytearray, log_path: Path, echo: bool) -> None:
    """torchrun's stderr into its log (its tracebacks and notes, whole, as written), and to ours with --verbose
    (control characters escaped, as every line the console shows), keeping the tail for the failure report. A log
    that cannot be written (a full disk) or a console whose reader is gone (`2>&1 | head` exited) stops nothing:
    keep reading, a full pipe would block torchrun and the ranks."""
    assert proc.stderr is not None
    out = sys.stderr if echo else None
    # torchrun's stderr carries the ranks' own (a library's warning, a traceback quoting a dataset row): decoded as
    # it comes, a character cut between two reads kept for the next, and shown through the console door
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 - closed below, written as torchrun writes
    except OSError:
        log = None
    while chunk := os.read(proc.stderr.fileno(), 65536):
        if out is not None:
            try:
                out.write(printable(decoder.decode(chunk)))
                out.flush()
            except (OSError, ValueError):
                out = None
        if log is not None:
            try:
                log.write(chunk)
                log.flush()
            except OSError:
                log = None
        tail.extend(chunk)
        del tail[:-65536]
    if log is not None:
        try:
            log.close()
        except OSError:
            pass
