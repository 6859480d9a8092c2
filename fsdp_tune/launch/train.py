"""`fsdp-tune train`: validate, resolve resume, decide the rank spec, pre-flight, launch, read the outcome."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fsdp_tune import summary as run_summary
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding, PreflightError, Severity, UsageError
from fsdp_tune.launch import manifest, torchrun
from fsdp_tune.launch.checkpoints import latest_complete
from fsdp_tune.launch.decide import decide
from fsdp_tune.launch.failure import failure_report
from fsdp_tune.launch.machine import Machine, probe
from fsdp_tune.launch.spec import RankSpec
from fsdp_tune.validate import Checked, load

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Planned:
    checked: Checked
    spec: RankSpec
    machine_findings: list[Finding]  # pre-flight: what this machine and these files say about the launch

    @property
    def config(self) -> RunConfig:
        return self.checked.config


def resolve_resume(cfg: RunConfig, echo: Echo) -> str | None:
    wanted = cfg.training.get("resume_from_checkpoint")
    if not wanted:
        return None
    output_dir = cfg.training.get("output_dir") or ""
    if str(wanted).lower() == "latest":
        best, skipped = latest_complete(output_dir)
        for c in skipped:
            echo(f"warning: skipping incomplete checkpoint {c.path} (no completion marker; left in place)")
        if best is None:
            echo(f"note: no complete checkpoint in {output_dir}: starting from step 0")
            return None
        echo(f"resuming from {best.path} (step {best.step})")
        return str(best.path.resolve())
    path = Path(str(wanted)).expanduser()
    if not path.is_dir():
        raise UsageError(
            f"--resume_from_checkpoint {wanted}: no such checkpoint folder",
            "--resume_from_checkpoint latest picks the newest complete one in --output_dir",
        )
    return str(path.resolve())


def plan_run(config: str | None, argv: list[str], echo: Echo, machine: Machine | None = None) -> Planned:
    """Everything decided before a process starts; nothing is written."""
    from fsdp_tune.launch.preflight import check_data, check_machine

    checked = load(config, argv)
    cfg = checked.config
    machine = machine or probe()
    resume = resolve_resume(cfg, echo)
    spec, findings = check_data(decide(cfg, machine, resume))
    findings += check_machine(cfg, spec, machine, resume_requested=bool(cfg.training.get("resume_from_checkpoint")))
    return Planned(checked, spec, findings)


def preflight_error(findings: list[Finding]) -> PreflightError | None:
    errors = [f for f in findings if f.severity is Severity.ERROR]
    return PreflightError(errors) if errors else None


def execute(planned: Planned, echo_err: Echo) -> run_summary.RunSummary | None:
    """Launch the planned run and wait; the summary of a finished run (None on machines other than 0 when
    rank 0 runs elsewhere). Raises LaunchError for a failed or interrupted run."""
    error = preflight_error(planned.machine_findings)
    if error:
        raise error
    spec = torchrun.prepare(planned.config, planned.spec)
    first_node = spec.world.node_rank == 0
    if first_node:  # one manifest per run, even when the nodes share the output folder
        manifest.write_start(planned.config, spec)
    outcome = torchrun.run(spec)
    if first_node:
        manifest.write_end(spec, outcome.returncode)
    result = run_summary.read(spec.output_dir)
    if outcome.returncode != 0 or outcome.signal is not None:
        if isinstance(result, run_summary.Interrupted):
            saved = "checkpoint saved" if result.checkpoint_saved else "no checkpoint (checkpoints are off)"
            echo_err(
                f"stopped at step {result.interrupted_at_step}: {saved}; continue with --resume_from_checkpoint latest"
            )
        raise failure_report(spec.output_dir, outcome)
    return result if isinstance(result, run_summary.RunSummary) else None
