"""A node's place in a multi-node job, read from where its scheduler puts it (variables.py says which variable
fills which launch key), checked before anything starts.

Partial variables (SLURM's node count without its node id, PET_NNODES without PET_MASTER_ADDR, ...) are PF090;
contradictory ones (two variables or two schedulers that disagree, a rank outside the node count, a node list
of another length, this host at another place in it) are PF091; a launch in the wrong place (a multi-node SLURM
job's batch script rather than srun's step, several srun tasks on one node, fsdp-tune inside torchrun) is PF094.
All of them are errors before any rank starts. merge.py then fills the launch keys from what was read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from fsdp_tune.config.schema import Origin
from fsdp_tune.errors import Finding, PreflightError, Severity
from fsdp_tune.schedulers.variables import NEEDED, SCHEDULERS, TORCHRUN_WORKER, Read, Scheduler

WORDS = {
    "num_machines": "how many machines",
    "machine_rank": "its machine rank",
    "main_process_ip": "machine 0's address",
}


@dataclass(frozen=True)
class Value:
    value: object
    variable: str
    text: str  # as the variable says it
    scheduler: str
    how: str = ""
    at_most: bool = False

    @property
    def origin(self) -> Origin:
        return Origin(self.variable, f"environment, {self.scheduler}")

    @property
    def said(self) -> str:
        text = repr(self.text) if "\n" in self.text else self.text
        return f"{self.how}{self.variable}={text}"


@dataclass(frozen=True)
class Topology:
    """What the schedulers whose variables are here say; empty when none is."""

    schedulers: tuple[str, ...] = ()
    values: dict[str, Value] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.schedulers)

    def get(self, key: str):
        v = self.values.get(key)
        return None if v is None else v.value

    def describe(self) -> str:
        """One line for the launch plan: each value and the variable it came from."""
        v = self.values
        parts = []
        if "num_machines" in v:
            parts.append(f"{v['num_machines'].value} machine(s) ({v['num_machines'].said})")
        if "machine_rank" in v:
            parts.append(f"this is machine {v['machine_rank'].value} ({v['machine_rank'].said})")
        if "main_process_ip" in v:
            parts.append(f"machine 0 at {v['main_process_ip'].value} ({v['main_process_ip'].said})")
        if "main_process_port" in v:
            parts.append(f"port {v['main_process_port'].value} ({v['main_process_port'].said})")
        if "nproc_per_node" in v:
            n = v["nproc_per_node"]
            parts.append(f"{'up to ' if n.at_most else ''}{n.value} process(es) a machine ({n.said})")
        if "rdzv_backend" in v:
            parts.append(f"rendezvous {v['rdzv_backend'].value} ({v['rdzv_backend'].said})")
        return f"scheduler: {' and '.join(self.schedulers)}: " + ", ".join(parts)


def read(env: Mapping[str, str] | None = None) -> Topology:
    """This node's topology from `env` (the process environment by default); PreflightError when it is partial,
    contradictory or in the wrong place. With two schedulers' variables (SkyPilot on a SLURM cluster) the one closer
    to the job is read (SCHEDULERS' order); the other must be whole and agree on the number of machines."""
    env = os.environ if env is None else env
    findings = _inside_torchrun(env)
    values: dict[str, Value] = {}
    present: list[str] = []
    for scheduler in SCHEDULERS:
        if not any(name in env for name in scheduler.markers):
            continue
        present.append(scheduler.name)
        got, found = _read_scheduler(scheduler, env)
        findings += found
        if len(present) == 1:
            values = got
        elif "num_machines" in got and "num_machines" in values:  # the job's size is the same, whoever says it
            if got["num_machines"].value != values["num_machines"].value:
                findings.append(_contradiction(values["num_machines"], got["num_machines"]))
    if findings:
        raise PreflightError(findings)
    return Topology(tuple(present), values)


def _read_scheduler(s: Scheduler, env: Mapping[str, str]) -> tuple[dict[str, Value], list[Finding]]:
    values: dict[str, Value] = {}
    findings: list[Finding] = []
    for r in s.reads:
        v, found = _read_one(s, r, env)
        findings += found
        if v is None or v.value is None:
            continue
        if r.key in values and values[r.key].value != v.value:
            findings.append(_contradiction(values[r.key], v))
            continue
        values.setdefault(r.key, v)
    if findings:
        return values, findings
    findings += _partial(s, values, env) or _consistent(s, values, env)
    return values, findings


def _read_one(s: Scheduler, r: Read, env: Mapping[str, str]) -> tuple[Value | None, list[Finding]]:
    """The first group of r.names with a variable set; every set one must read the same."""
    for group in r.names:
        given = [(name, env[name]) for name in group if name in env]
        if not given:
            continue
        read: list[Value] = []
        for name, text in given:
            try:
                read.append(Value(r.parse(text), name, text.strip(), s.name, r.how, r.at_most))
            except ValueError as err:
                return None, [_unreadable(s, name, text, str(err))]
        for other in read[1:]:
            if other.value != read[0].value:
                return None, [_contradiction(read[0], other)]
        return read[0], []
    return None, []


def _partial(s: Scheduler, values: dict[str, Value], env: Mapping[str, str]) -> list[Finding]:
    nodes = values.get("num_machines")
    needed = NEEDED if nodes is None or nodes.value != 1 else NEEDED[:2]
    missing = [k for k in needed if k not in values]
    if not missing:
        return []
    wanted = [" or ".join(n for r in s.reads if r.key == k for group in r.names for n in group) for k in missing]
    have = ", ".join(sorted(n for n in env if any(n in group for r in s.reads for group in r.names)))
    return [
        Finding(
            "PF090",
            Severity.ERROR,
            ", ".join(wanted),
            f"environment, {s.name}",
            f"{s.name}'s variables are here ({have or ', '.join(n for n in s.markers if n in env)}) but not "
            f"{'; '.join(wanted)}: this node cannot tell {' or '.join(WORDS[k] for k in missing)}",
            f"start fsdp-tune the way {s.name} starts a job's nodes (it sets them all), or unset its variables "
            "and say the topology with --num_machines, --machine_rank, --main_process_ip",
        )
    ]


def _consistent(s: Scheduler, values: dict[str, Value], env: Mapping[str, str]) -> list[Finding]:
    """A rank inside the node count, a node list of that length with this node at its rank, srun's step."""
    nodes, rank = values["num_machines"], values["machine_rank"]
    if not int(rank.value) < int(nodes.value):
        return [_against(s, rank, nodes, f"machine rank {rank.value} is outside [0, {nodes.value})")]
    found = _listed(s, values, env)
    if s.step and int(nodes.value) > 1 and s.step not in env:
        found.append(_misplaced(s.name, f"{nodes.said} but no {s.step}: this is the batch script, on one node"))
    tasks, step_nodes = env.get("SLURM_STEP_NUM_TASKS"), env.get("SLURM_STEP_NUM_NODES")
    if s.step and tasks and step_nodes and tasks.strip() != step_nodes.strip():
        many = f"srun started {tasks} tasks on {step_nodes} node(s); each would start torchrun with the node's GPUs"
        found.append(_misplaced(s.name, many))
    return found


def _listed(s: Scheduler, values: dict[str, Value], env: Mapping[str, str]) -> list[Finding]:
    if s.listed is None:
        return []
    for group in s.listed.names:
        name = next((n for n in group if n in env), None)
        if name is None:
            continue
        hosts = s.listed.parse(env[name])
        nodes, rank = values["num_machines"], values["machine_rank"]
        listed = Value(hosts, name, env[name].strip(), s.name)
        if len(hosts) != int(nodes.value):
            return [_against(s, listed, nodes, f"{name} names {len(hosts)} host(s), not {nodes.value}")]
        me = env.get(s.listed.me or "")
        if me and me in hosts and hosts.index(me) != int(rank.value):
            where = Value(me, s.listed.me or "", me, s.name)
            return [_against(s, where, rank, f"{me} is host {hosts.index(me)} of {name}, not {rank.value}")]
        return []
    return []


def _inside_torchrun(env: Mapping[str, str]) -> list[Finding]:
    given = [n for n in TORCHRUN_WORKER if n in env]
    if "LOCAL_RANK" not in given or len(given) < 2:
        return []
    return [
        _misplaced(
            "torchrun",
            f"{', '.join(f'{n}={env[n]}' for n in given)}: fsdp-tune runs inside a process torchrun started, and "
            "would start torchrun again on every rank",
            "run `fsdp-tune train` once per machine, not under torchrun: it starts torchrun itself",
        )
    ]


def _unreadable(s: Scheduler, name: str, text: str, why: str) -> Finding:
    return Finding(
        "PF091",
        Severity.ERROR,
        name,
        f"environment, {s.name}",
        f"{name}={text.strip()!r} cannot be read: {why}",
        f"this variable is {s.name}'s: launch under {s.name} as it documents, or unset it",
    )


def _contradiction(a: Value, b: Value) -> Finding:
    who = a.scheduler if a.scheduler == b.scheduler else f"{a.scheduler} and {b.scheduler}"
    return Finding(
        "PF091",
        Severity.ERROR,
        f"{a.variable}, {b.variable}",
        f"environment, {who}",
        f"{a.said} and {b.said} disagree",
        "one scheduler launches a job: unset the variables of the other, or the one left over from another job",
    )


def _against(s: Scheduler, a: Value, b: Value, message: str) -> Finding:
    return Finding(
        "PF091",
        Severity.ERROR,
        f"{a.variable}, {b.variable}",
        f"environment, {s.name}",
        f"{message} ({a.said}, {b.said})",
        f"these come from {s.name} itself: a variable left over from another job, or set by hand, disagrees",
    )


def _misplaced(who: str, message: str, hint: str = "") -> Finding:
    return Finding(
        "PF094",
        Severity.ERROR,
        "environment",
        f"environment, {who}",
        message,
        hint
        or "run one `fsdp-tune train` per node under srun: `srun --ntasks-per-node=1 fsdp-tune train ...` "
        "(fsdp-tune train --emit slurm writes such a job)",
    )
