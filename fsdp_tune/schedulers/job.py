"""A scheduler-neutral job, decided from the validated launch and its memory plan: what every emitted file says.

The line each node runs is the launch as given, with the job's size said outright (`--num_processes`,
`--num_machines`), `--resume_from_checkpoint latest` (the first attempt starts from step 0 and a requeued one
continues: launch/train.py `_latest`) and the output folder on the folder the nodes share. Which machine a node
is, and where machine 0 is, are left to the scheduler's variables (schedulers/topology.py), so every node runs
the same line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# README "Preemption on a cluster": the grace covers one step plus one checkpoint; never less than the 120 s the
# shipped sbatch script gave
MIN_GRACE_S = 120
GRACE_MARGIN_S = 30
CHECKPOINT_GBS = 1.0  # assumed write speed of the shared folder, GB/s (a stated assumption, not measured)
CHECKPOINT_BYTES_A_TRAINABLE = 12  # fp32 weight + AdamW's two moments (Trainer's default optimizer)
HOST_HEADROOM = 1.10  # over the plan's peak host memory a node, rounded up to 8 GiB


@dataclass(frozen=True)
class Job:
    scheduler: str  # a key of emit.EMITTERS
    name: str
    nodes: int
    procs_per_node: int
    gpu: str | None  # the planner's GPU key (h100, ...), None for a CPU run
    gpu_name: str | None
    memory_gib: int  # host memory asked a node
    cpus: int  # CPUs asked a node: one a rank and its data-loader workers
    grace_s: int  # stop signal to SIGKILL: one step and one checkpoint
    config: str | None  # the config file as the nodes see it
    args: tuple[str, ...]  # after `fsdp-tune train --config CONFIG`
    output_dir: str  # as the nodes see it
    shared: str  # SLURM: a folder; Kubeflow: a PersistentVolumeClaim; SkyPilot: a bucket
    mount: str  # where the nodes see the shared folder
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None  # Kubeflow's container image
    workdir: str = "."  # where relative paths (the config, local data) resolve: SLURM's --chdir, the emitting folder
    facts: tuple[str, ...] = ()  # what the plan said, for the file's header
    data_paths: tuple[str, ...] = ()  # local data files and folders the nodes read (as the file names them)
    shared_given: bool = True  # False: SLURM's shared folder is the one emitted from, not known to be shared
    pins: dict[str, str] = field(default_factory=dict)  # package -> the version this launch was validated with
    origins: dict[str, tuple[str, str]] = field(default_factory=dict)  # field -> (key, source) the user gave it

    @property
    def argv(self) -> list[str]:
        """`fsdp-tune train ...` as every node runs it (after the executable)."""
        return ["train", *(["--config", self.config] if self.config else []), *self.args]


def grace_s(plan: dict, trainable: int) -> int:
    """One planned step and one checkpoint written at CHECKPOINT_GBS, plus a margin; at least MIN_GRACE_S."""
    step = float((plan.get("step_time") or {}).get("step_s") or 0.0)
    write = trainable * CHECKPOINT_BYTES_A_TRAINABLE / (CHECKPOINT_GBS * 1e9)
    return max(MIN_GRACE_S, int(math.ceil((step + write + GRACE_MARGIN_S) / 10) * 10))


def memory_gib(plan: dict) -> int:
    peak = float(plan.get("host_memory_gib_per_node") or 0.0)
    return max(8, int(math.ceil(peak * HOST_HEADROOM / 8) * 8))


def facts(plan: dict, nodes: int, per: int, gpu_name: str | None, grace: int) -> tuple[str, ...]:
    """The plan's figures the file was sized by, one line each."""
    ranks = f"{nodes * per} ranks on {nodes} machine(s) x {per} {gpu_name or 'CPU process(es)'}"
    out = [f"the validated launch: {ranks}"]
    if plan.get("range_gib"):
        low, high = plan["range_gib"]
        out.append(f"planned GPU memory: {low:.1f}-{high:.1f} GiB of {plan['gpu_memory_gib']:.1f} GiB a GPU (fits)")
    out.append(f"planned host memory a node: {plan.get('host_memory_gib_per_node')} GiB at peak")
    step = (plan.get("step_time") or {}).get("step_s")
    said = f"one step ~{step:.0f} s (planned) + one checkpoint" if step else "one step + one checkpoint"
    out.append(f"stop grace: {grace} s ({said}, at least {MIN_GRACE_S} s)")
    return tuple(out)


def without(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """`argv` less the flags `names` (spelled with - or _) and the words each takes (up to the next flag)."""
    out: list[str] = []
    dropping = False
    wanted = {n.replace("-", "_") for n in names}
    for token in argv:
        if token.startswith("--"):
            dropping = token[2:].partition("=")[0].replace("-", "_") in wanted
            if dropping:
                continue
        elif dropping:
            continue
        out.append(token)
    return out


def given(argv: list[str], name: str) -> str | None:
    """The value of flag `name` in `argv` (the last one), or None; a bare flag is ''."""
    found = None
    want = name.replace("-", "_")
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        flag, eq, inline = token[2:].partition("=")
        if flag.replace("-", "_") != want:
            continue
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        found = inline if eq else ("" if nxt.startswith("--") else nxt)
    return found
