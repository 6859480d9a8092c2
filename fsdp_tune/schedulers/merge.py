"""The scheduler's topology into the launch keys, beside what the config file and the flags say.

The scheduler knows where this node is; the launch line says what the job is. So, key by key:
- not given: the scheduler's value, with the variable as its origin (`--dry_run` and every finding name it);
- the same: nothing changes;
- in the config file, otherwise: the scheduler's value, with a warning (PF093): a file shared by the nodes cannot
  say each node's rank or address, and one written for one machine (the seed's `num_machines: 1`) is reused here;
- on the command line, otherwise: refused (PF092) for the counts (machines, this node's rank, processes a
  machine), since this node was told two things; for the address and the port the flag wins, with a note (an
  address can name machine 0 by another interface than the scheduler's host name).
Processes: accelerate counts them in total (num_processes), schedulers per machine; a scheduler's GPU count is a
ceiling (fewer processes a machine are fine, more are refused), PET_NPROC_PER_NODE an exact number.
"""

from __future__ import annotations

from fsdp_tune.config.schema import Assignment, Origin
from fsdp_tune.errors import Finding, PreflightError, Severity
from fsdp_tune.schedulers.topology import Topology, Value
from fsdp_tune.schedulers.variables import KEYS

FLAG_WINS = ("main_process_ip", "main_process_port")
COMMAND_LINE = "command line"


def merge(topology: Topology, assignments: list[Assignment]) -> tuple[list[Assignment], list[Finding]]:
    """`assignments` (file first, flags last) with the scheduler's after them; the warnings. PreflightError
    (PF092) when a flag contradicts the scheduler."""
    if not topology:
        return assignments, []
    final = {a.path: a for a in assignments}
    added: list[Assignment] = []
    errors: list[Finding] = []
    notes: list[Finding] = []
    for key, v in topology.values.items():
        if key == "nproc_per_node":
            continue
        given = final.get(KEYS[key])
        if given is not None and _same(given.value, v.value):
            continue
        if given is None or given.origin.source != COMMAND_LINE:
            if given is not None:
                notes.append(_replaced(given, v))
            added.append(Assignment(KEYS[key], v.value, v.origin))
        elif key in FLAG_WINS:
            notes.append(_flag_wins(given, v))
        else:
            errors.append(_refused(given, v))
    added += _processes(topology, final, errors, notes)
    if errors:
        raise PreflightError(errors)
    return assignments + added, notes


def _processes(topology: Topology, final: dict, errors: list[Finding], notes: list[Finding]) -> list[Assignment]:
    """num_processes = machines x processes a machine, the latter from the scheduler or, kept, the config's."""
    nodes = topology.values.get("num_machines")
    if nodes is None:
        return []
    total, their_nodes = final.get("launch.num_processes"), final.get("launch.num_machines")
    per: int | None = None
    if total is not None:
        try:
            n_total, n_nodes = int(total.value), int(their_nodes.value) if their_nodes else 1
        except (TypeError, ValueError):
            return []  # the config's own rules say what is wrong with it
        if n_nodes < 1 or n_total % n_nodes:
            return []
        per = n_total // n_nodes
    sched = topology.values.get("nproc_per_node")
    on_cpu = str(getattr(final.get("launch.use_cpu"), "value", "")).strip().lower() in ("true", "1", "yes")
    if sched is not None and (sched.at_most and on_cpu):
        sched = None  # GPUs given to a CPU run say nothing about its processes
    want, origin = per or 1, Origin(f"{nodes.variable} x processes a machine", f"environment, {nodes.scheduler}")
    if sched is not None:
        given = int(sched.value)
        if per is None or (per != given and not sched.at_most and total.origin.source != COMMAND_LINE):
            if per is not None:  # an exact count (PET_NPROC_PER_NODE) beats the file's
                notes.append(_per_machine(total, their_nodes, per, sched, replaced=True))
            want, origin = given, Origin(f"{nodes.variable} x {sched.variable}", sched.origin.source)
        elif per > given or (per != given and not sched.at_most):
            errors.append(_per_machine(total, their_nodes, per, sched, replaced=False))
            return []
    n = int(nodes.value) * want
    if total is not None and _same(total.value, n):
        return []
    if total is not None and want == per:  # the same a machine, on the scheduler's number of machines
        notes.append(_scaled(total, their_nodes, per, nodes, n))
    return [Assignment("launch.num_processes", n, origin)]


def _same(given: object, value: object) -> bool:
    return str(given).strip().lower() == str(value).strip().lower()


def _replaced(given: Assignment, v: Value) -> Finding:
    return Finding(
        "PF093",
        Severity.WARNING,
        given.origin.key,
        given.origin.source,
        f"{given.value} here is replaced by {v.value} from {v.said}: the scheduler says where this node is",
        f"drop `{given.origin.key}` from the file the nodes share, or launch outside {v.scheduler}",
    )


def _flag_wins(given: Assignment, v: Value) -> Finding:
    return Finding(
        "PF093",
        Severity.NOTE,
        given.origin.key,
        COMMAND_LINE,
        f"{given.value} is used, not {v.value} from {v.said} (an address or port given for this launch wins)",
        f"drop {given.origin.key} to use {v.scheduler}'s",
    )


def _refused(given: Assignment, v: Value) -> Finding:
    return Finding(
        "PF092",
        Severity.ERROR,
        given.origin.key,
        COMMAND_LINE,
        f"{given.value} contradicts {v.said}: {v.scheduler} started this node otherwise",
        f"drop {given.origin.key} ({v.scheduler} says it), or ask {v.scheduler} for the job you mean",
    )


def _per_machine(total: Assignment, nodes: Assignment | None, per: int, v: Value, replaced: bool) -> Finding:
    given = f"{total.origin.key} {total.value}" + (f" over {nodes.value} machine(s)" if nodes else "")
    kind = "GPUs given to this node" if v.at_most else "processes a node"
    if replaced:
        return Finding(
            "PF093",
            Severity.WARNING,
            total.origin.key,
            total.origin.source,
            f"{given} is {per} a machine; {v.said} ({kind}) is used instead",
            f"drop `{total.origin.key}` from the file, or give it as the scheduler does",
        )
    return Finding(
        "PF092",
        Severity.ERROR,
        total.origin.key,
        total.origin.source,
        f"{given} is {per} process(es) a machine, but {v.said} ({kind})",
        f"ask {v.scheduler} for {per} GPUs a node, or pass --num_processes for at most {v.value} a machine",
    )


def _scaled(total: Assignment, nodes: Assignment | None, per: int, v: Value, n: int) -> Finding:
    over = f"{nodes.value} machine(s)" if nodes else "one machine (num_machines unset)"
    return Finding(
        "PF093",
        Severity.WARNING,
        total.origin.key,
        total.origin.source,
        f"{total.value} processes over {over} is {per} a machine; on the {v.value} machines of {v.said}: {n}",
        f"--num_machines {v.value} --num_processes {int(v.value) * per} says so (what --emit writes)",
    )
