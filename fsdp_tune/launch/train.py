"""`fsdp-tune train`: validate, resolve resume, decide the rank spec, pre-flight, own the output folder,
launch, read the outcome."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fsdp_tune import summary as run_summary
from fsdp_tune.config.run_folder import output_dir as run_output_dir
from fsdp_tune.config.run_folder import resume_request
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.data import read_files
from fsdp_tune.decide.datafiles import Counted
from fsdp_tune.decide.env import secret_env as decided_secrets
from fsdp_tune.decide.machine import Machine, probe
from fsdp_tune.decide.rank import decide
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.errors import Finding, LaunchError, PreflightError, Severity, UsageError
from fsdp_tune.launch import torchrun
from fsdp_tune.launch.failure import Outcome, failure_report, stopped
from fsdp_tune.preflight import batch
from fsdp_tune.preflight.memory import plan_generation
from fsdp_tune.preflight.resume import fsdp_version_findings, resume_findings, schedule_findings
from fsdp_tune.rundir import manifest, outdir, ownership
from fsdp_tune.rundir.checkpoints import folder_run_id, latest_complete, marker_run_id, verify
from fsdp_tune.runfiles import COMPLETE_MARKER, MANIFEST_NAME
from fsdp_tune.schedulers import merge, topology
from fsdp_tune.schedulers.topology import Topology
from fsdp_tune.validate import Checked, load

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Planned:
    checked: Checked
    spec: RankSpec
    machine_findings: list[Finding]  # pre-flight: what this machine and these files say about the launch
    run_id: str = ""  # the run this launch is: the folder's run when it resumes it, a new one otherwise
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)  # for the ranks' environment, no file
    machine: Machine | None = None  # what the spec was decided for
    topology: Topology = field(default_factory=Topology)  # what a scheduler's variables said (schedulers/)
    counted: tuple[Counted, ...] = ()  # what the data pre-flight counted of each source, beside the spec

    @property
    def config(self) -> RunConfig:
        return self.checked.config

    @property
    def resuming(self) -> bool:
        return resume_request(self.config) is not None


def resolve_resume(cfg: RunConfig, echo: Echo) -> str | None:
    """The checkpoint to resume, verified against its completion marker (PF036 when it is not whole); what it was
    trained with is compared in pre-flight (preflight/resume.py: PF039, PF051)."""
    return _resume_point(cfg, echo)


def _resume_point(cfg: RunConfig, echo: Echo) -> str | None:
    wanted = resume_request(cfg)
    if wanted is None:
        return None
    output_dir = run_output_dir(cfg)  # the folder the rank spec writes to (config/run_folder.py)
    if wanted.lower() == "latest":
        return _latest(output_dir, echo)
    path = Path(str(wanted)).expanduser()
    if not path.is_dir():
        raise UsageError(
            f"--resume_from_checkpoint {wanted}: no such checkpoint folder",
            "--resume_from_checkpoint latest picks the newest complete one in --output_dir",
        )
    if not (path / COMPLETE_MARKER).exists():
        echo(
            f"warning: {path} has no completion marker ({COMPLETE_MARKER}): its files cannot be checked against "
            "what was written; loading it as is"
        )
    else:
        problem = verify(path)
        if problem:
            raise PreflightError([_damaged(path, problem, "--resume_from_checkpoint latest, or another checkpoint")])
        theirs, ours = marker_run_id(path), folder_run_id(output_dir)
        if theirs and theirs != ours:
            echo(f"note: continuing {path}, a checkpoint of run {theirs} (named by path)")
    return check_loadable(str(path.resolve()))


def check_loadable(checkpoint: str | None) -> str | None:
    """`checkpoint` when every pickle a resume loads from it is data (rundir/pickles.py); PF060 otherwise.
    Refused outright, never passed over for an older one: a planted pickle is not an accident."""
    from fsdp_tune.rundir.pickles import check_checkpoint

    unsafe = check_checkpoint(checkpoint) if checkpoint else None
    if unsafe is None:
        return checkpoint
    finding = Finding(
        "PF060",
        Severity.ERROR,
        "--resume_from_checkpoint",
        "command line",
        f"{unsafe.file}: {unsafe.what}; resuming would load it on every rank (a pickle runs what it names)",
        f"resume only checkpoints you wrote: move {checkpoint} away and resume another "
        "(--resume_from_checkpoint PATH), or start over",
    )
    raise PreflightError([finding])


def _latest(output_dir: str, echo: Echo) -> str | None:
    best, skipped = latest_complete(output_dir)
    ours = folder_run_id(output_dir)
    for c in skipped:
        if not c.complete:
            echo(f"warning: skipping incomplete checkpoint {c.path} (no completion marker; left in place)")
        else:
            echo(f"warning: skipping {c.path}: {c.problem} (left in place)")
    if best is None:
        damaged = [c for c in skipped if c.complete and not (ours and c.run_id and c.run_id != ours)]
        if damaged:
            hint = "--resume_from_checkpoint PATH of an older checkpoint, or --overwrite_output_dir to start over"
            raise PreflightError([_damaged(damaged[0].path, damaged[0].problem or "", hint)])
        echo(f"note: no complete checkpoint of this run in {output_dir}: starting from step 0")
        return None
    if not best.run_id:
        whose = "written without a run id by an earlier fsdp-tune"
    elif best.run_id == ours:
        whose = f"run {best.run_id}, the run this folder holds"
    else:
        whose = f"run {best.run_id}: no manifest here names another run, so that run continues"
    checked = check_loadable(str(best.path.resolve()))
    echo(f"resuming from {best.path} (step {best.step}, {whose})")
    return checked


def _damaged(path: Path, problem: str, hint: str) -> Finding:
    return Finding(
        "PF036",
        Severity.ERROR,
        "--resume_from_checkpoint",
        "command line",
        f"{path} cannot be resumed: {problem}; Trainer would restart what is missing without a word",
        hint,
    )


def plan_run(
    config: str | None,
    argv: list[str],
    echo: Echo,
    machine: Machine | Callable[[RunConfig], Machine] | None = None,
    console: str = "lines",
    env: Mapping[str, str] | None = None,
) -> Planned:
    """Everything decided before a process starts; nothing is written. `console`: what rank 0 shows
    (decide.console_mode); `machine`: the machine to decide for (a function of the config for a simulated node
    sized by it, `train --dry_run --gpu`), this one by default; `env`: where a scheduler's variables are read
    (schedulers/topology.py), this process's environment by default (`--emit`: the ones the scheduler would set)."""
    from fsdp_tune.preflight.checks import check_data, check_machine
    from fsdp_tune.rules.catalog import machine_findings

    topo = topology.read(env)  # partial or contradictory: PF090-PF094, before anything else
    checked = load(config, argv, scheduler=lambda assignments: merge.merge(topo, assignments))
    cfg = checked.config
    machine = machine(cfg) if callable(machine) else machine or probe()
    resume = resolve_resume(cfg, echo)
    files = read_files(cfg)  # the data files, read once: the spec is decided from them, the pre-flight checks them
    generation = plan_generation(cfg, machine)  # gathered once per generation, or sharded (planner/generating.py)
    spec = decide(cfg, machine, resume, console, files=files, generation=generation)
    counted, findings = check_data(spec, files)
    secret_env = decided_secrets(cfg)  # --hub_token: the ranks' environment, never the spec's file
    resuming = resume_request(cfg) is not None
    findings += check_machine(cfg, spec, machine, resume_requested=resuming, counted=counted)
    findings += machine_findings(cfg, machine, checked.findings)  # the config's rules on this machine's decisions
    findings += resume_findings(resume, spec) + fsdp_version_findings(resume, cfg) + schedule_findings(resume, spec)
    if spec.world.node_rank == 0:
        findings += outdir.replay_findings(config, checked.format, spec.output_dir, resuming)
    findings += batch.resume_batch(resume, spec) + batch.rows_for_one_step(spec, counted)
    continued = resuming and (folder_run_id(spec.output_dir) or (resume and marker_run_id(resume)))
    run_id = continued or ownership.new_run_id()
    return Planned(checked, spec, findings, run_id, secret_env, machine, topo, counted)


def preflight_error(findings: list[Finding]) -> PreflightError | None:
    errors = [f for f in findings if f.severity is Severity.ERROR]
    return PreflightError(errors) if errors else None


def execute(planned: Planned, echo_err: Echo) -> run_summary.RunSummary | None:
    """Own the output folder, launch the planned run and wait; the summary of a finished run (None on
    machines other than 0 when rank 0 runs elsewhere). Raises LaunchError for a failed or interrupted run."""
    error = preflight_error(planned.machine_findings)
    if error:
        raise error
    if planned.spec.world.node_rank > 0:  # machine 0 owns the folder the machines share
        return _launch(planned, echo_err, keep_fds=())
    lock = ownership.acquire(planned.spec.output_dir, planned.run_id)
    try:
        if lock.note:
            echo_err(lock.note)
        if planned.config.run.overwrite_output_dir and not planned.resuming:
            folder = outdir.inspect(planned.spec.output_dir)
            refused = outdir.findings(folder, resume=False, overwrite=True)  # again: the folder may have changed
            if refused:
                raise PreflightError(refused)
            if folder.kind == "run":
                moved = outdir.move_aside(folder)
                echo_err(f"--overwrite_output_dir: moved what {folder.path} held to {moved} (nothing deleted)")
        return _launch(planned, echo_err, keep_fds=(lock.fd,))
    finally:
        lock.release()


def _launch(planned: Planned, echo_err: Echo, keep_fds: tuple[int, ...]) -> run_summary.RunSummary | None:
    spec = torchrun.prepare(planned.config, planned.spec, planned.run_id)
    first_node = spec.world.node_rank == 0
    attempt = uuid.uuid4().hex[:12]  # this launch: its manifest entry, and the summary its ranks write
    if first_node:  # one manifest per run, even when the nodes share the output folder
        try:
            manifest.write_start(planned.config, spec, planned.run_id, attempt)
        except OSError as err:
            raise PreflightError([_unwritable(spec, err)]) from None
    outcome = torchrun.run(spec, planned.run_id, keep_fds, secret_env=planned.secret_env, attempt=attempt)
    cause = None
    try:
        return _outcome(spec, outcome, echo_err, attempt if first_node else None)
    except LaunchError as failed:
        cause = _root_cause(str(failed))  # a failure's root cause, or "stopped by SIGINT (Ctrl-C)..."
        raise
    finally:
        if first_node:
            try:
                manifest.write_end(spec, outcome.returncode, cause)
            except OSError as err:  # a full disk must not hide how the run ended
                echo_err(f"warning: could not record the end of the run in {MANIFEST_NAME}: {err}")


def _root_cause(report: str) -> str:
    """The failure report's root cause, one line, for the attempt's record (`report` shows it)."""
    lines = report.splitlines()
    said = [line.split("root cause:", 1)[1].strip() for line in lines if line.strip().startswith("root cause:")]
    return (said[0] if said else lines[0] if lines else "")[:300]


def _outcome(
    spec: RankSpec, outcome: Outcome, echo_err: Echo, attempt: str | None = None
) -> run_summary.RunSummary | None:
    """A finished run's summary (this attempt's: a previous attempt's stays in the folder until replaced); an
    interrupted run (whoever received the signal: fsdp-tune, torchrun or only the ranks) is exit 130/143 with the
    resume hint; anything else is the failure report."""
    try:
        result = run_summary.read(spec.output_dir, attempt)
    except (OSError, ValueError, TypeError):
        result = None
    if isinstance(result, run_summary.RunSummary) and (outcome.returncode == 0 or outcome.signal is not None):
        return result  # finished before a stop request took effect (torchrun then ends on its SignalException)
    if isinstance(result, run_summary.Interrupted):
        saved = "checkpoint saved" if result.checkpoint_saved else "no checkpoint (checkpoints are off)"
        newest, _ = latest_complete(spec.output_dir)
        where = f" (it continues from {newest.path})" if newest is not None else ""
        echo_err(
            f"stopped at step {result.interrupted_at_step}: {saved}; continue with --resume_from_checkpoint latest"
            + where
        )
        signum = outcome.signal or result.signal or signal.SIGTERM
        raise stopped(signum, "" if outcome.signal else " (received by the ranks)")
    if outcome.returncode != 0 or outcome.signal is not None:
        raise failure_report(spec.output_dir, outcome)
    return result if isinstance(result, run_summary.RunSummary) else None


def _unwritable(spec: RankSpec, err: OSError) -> Finding:
    return Finding(
        "PF032",
        Severity.ERROR,
        "--output_dir",
        "command line",
        f"{Path(spec.output_dir) / MANIFEST_NAME} cannot be written ({err.strerror or err})",
        "free some space or choose another --output_dir",
    )
