"""Commands that plan or run training: train (through torchrun) and plan (memory and step time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from fsdp_tune.cli.common import ConfigOpt, DebugOpt, echo_out, guard, split_config, style
from fsdp_tune.errors import ExitCode


def train(
    ctx: typer.Context,
    config: Optional[str] = ConfigOpt,
    dry_run: bool = typer.Option(False, "--dry_run", "--dry-run", help="Print the plan; start nothing."),
    as_json: bool = typer.Option(False, "--json", help="With --dry_run: print the rank spec as JSON."),
    verbose: bool = typer.Option(
        False, "--verbose", help="Show everything the libraries print, live (it always goes to logs/rank-K.log)."
    ),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", help="With --dry_run: preview on a simulated GPU node, h100 | h200 | a100 | 4090."
    ),
    gpus: Optional[int] = typer.Option(
        None, "--gpus", help="With --gpu: the simulated node's GPUs (default: the run's processes per machine)."
    ),
    emit: Optional[str] = typer.Option(
        None, "--emit", help="Write the launch as a slurm | skypilot | kubeflow job (nothing is submitted)."
    ),
    emit_file: Optional[str] = typer.Option(None, "-o", "--emit_file", help="With --emit: the file (default: stdout)."),
    shared: Optional[str] = typer.Option(
        None, "--shared", help="With --emit: the nodes' shared folder (slurm), bucket (skypilot) or PVC (kubeflow)."
    ),
    image: Optional[str] = typer.Option(None, "--image", help="With --emit kubeflow: the container image."),
    force: bool = typer.Option(False, "--force", help="With --emit -o: replace an existing file."),
    debug: bool = DebugOpt,
) -> None:
    """Validate, check this machine, then train through torchrun (same flags as validate-config).

    The console shows the plan, each phase with its time, one progress line, evaluation results and the
    summary; everything the libraries print goes to OUTPUT_DIR/logs/rank-K.log (--verbose: also here).

    `--dry_run --gpu h100 [--gpus 8]` previews the launch on a simulated GPU node from any machine.
    Also: --resume_from_checkpoint latest|PATH, --overwrite_output_dir, --max_restarts N, --ddp_timeout S,
    --save_on_interrupt false. Exit codes: 0 trained (a dry run: could start), 1 training failed, 2 bad config or
    pre-flight (a dry run too), 3 internal error, 130/143 interrupted.
    """
    config, args = split_config(config, list(ctx.args))
    node = (gpu, gpus)
    if emit or emit_file or shared or image or force:
        job = (emit, emit_file, shared, image, force)
        guard(lambda: _emit(config, args, job, node), debug)
        return
    guard(lambda: _train(config, args, dry_run=dry_run, as_json=as_json, verbose=verbose, node=node), debug)


def _emit(config: str | None, args: list[str], job: tuple, node: tuple) -> None:
    """`--emit KIND [-o FILE]`: the validated launch as a scheduler's job (launch/emit.py); nothing starts."""
    from fsdp_tune.errors import UsageError
    from fsdp_tune.launch.emit import emit
    from fsdp_tune.output.files import write_out
    from fsdp_tune.schedulers.emitters import EMITTERS

    kind, out, shared, image, force = job
    if not kind:
        raise UsageError(
            "-o, --shared, --image and --force describe an emitted job", "add --emit slurm|skypilot|kubeflow"
        )
    if node[1] is not None:
        raise UsageError("--gpus: an emitted job asks for the launch's processes a machine", "drop --gpus")
    decided = emit(kind, config, args, lambda m: typer.echo(m, err=True), gpu=node[0], shared=shared, image=image)
    text = EMITTERS[kind].render(decided)
    if not out:
        typer.echo(text, nl=False)
        return
    write_out(out, text, force)  # the writer door: --force for an existing file, never through a link, atomic
    typer.echo(
        f"wrote {out}: {EMITTERS[kind].title} job, {decided.nodes} machine(s) x {decided.procs_per_node} "
        f"{'GPUs' if decided.gpu else 'CPU processes'}; nothing was submitted",
        err=True,
    )


def _train(
    config: str | None, args: list[str], dry_run: bool, as_json: bool, verbose: bool, node: tuple = (None, None)
) -> None:
    """Plan the run (validate, pre-flight, the rank spec), show it, then launch it unless this is a dry run;
    `node`: (--gpu, --gpus), a simulated GPU node to preview on."""
    import sys

    from fsdp_tune.decide import simulate
    from fsdp_tune.decide.rank import console_mode
    from fsdp_tune.launch.train import execute, plan_run
    from fsdp_tune.output.run import format_summary

    gpu, gpus = node
    simulate.refuse_without_dry_run(gpu, gpus, dry_run)
    machine = (lambda cfg: simulate.gpu_node(gpu, gpus or cfg.launch.nproc_per_node)) if gpu else None
    console = console_mode(verbose, sys.stdout.isatty())
    planned = plan_run(config, args, lambda m: typer.echo(m, err=True), machine=machine, console=console)
    if as_json and dry_run:
        typer.echo(json.dumps(_plan_json(planned, simulated=bool(gpu)), indent=2))
        _dry_run_exit(planned)
        return
    _show_plan(config, planned)
    if gpu:
        echo_out(simulate.describe(planned.machine))
    if dry_run:
        _dry_run(planned, simulated=bool(gpu))
        _dry_run_exit(planned)
        return
    _preflight_report(planned.machine_findings, dry_run=False)  # its errors: execute() refuses to start
    summary = execute(planned, lambda m: typer.echo(m, err=True))
    if summary:
        echo_out(format_summary(summary))
    if planned.spec.world.node_rank == 0:
        _plot(planned.spec.output_dir)


def _plan_json(planned, simulated: bool = False) -> dict:
    """`--dry_run --json`: the rank spec, torchrun's command, what pre-flight found on this machine and counted of
    the data (beside the spec: the ranks never read it), the run id; the simulated node (`--gpu`) it was decided
    for."""
    from dataclasses import asdict

    from fsdp_tune.launch import torchrun

    out = {
        "spec": planned.spec.as_dict(),
        "torchrun": torchrun.command(planned.spec),
        "preflight": [f.as_dict() for f in planned.machine_findings],
        "data_counted": [asdict(c) for c in planned.counted],
        "run_id": planned.run_id,
    }
    return dict(out, simulated_machine=asdict(planned.machine)) if simulated else out


def _show_plan(config: str | None, planned) -> None:
    """The config's findings (warnings, notes), then the plan every rank will execute."""
    from fsdp_tune.launch import torchrun
    from fsdp_tune.output.findings import format_findings
    from fsdp_tune.output.run import describe_launch

    if planned.checked.findings:
        typer.echo(format_findings(config or "the command line", planned.checked.findings, style), err=True)
    echo_out(describe_launch(planned.config, planned.spec, torchrun.command(planned.spec), planned.counted))
    if planned.topology:  # where this node's place in the job came from (schedulers/topology.py)
        echo_out("  " + planned.topology.describe())
    echo_out(f"  run id: {planned.run_id}")


def _dry_run(planned, simulated: bool = False) -> None:
    """The memory plan, and what would stop this machine (or the simulated node) from starting the run; nothing
    is started."""
    _dry_run_memory(planned, simulated)
    _preflight_report(planned.machine_findings, dry_run=True, simulated=simulated)
    typer.echo("dry run: nothing was started")


def _dry_run_exit(planned) -> None:
    """A dry run whose pre-flight found an error exits 2, as the launch would (a CI gate on `--dry_run` must not
    pass what cannot start); the report was printed already (or is in the JSON's "preflight")."""
    from fsdp_tune.launch.train import preflight_error

    if preflight_error(planned.machine_findings) is not None:
        raise typer.Exit(int(ExitCode.BAD_CONFIG))


def _preflight_report(findings: list, dry_run: bool, simulated: bool = False) -> None:
    """The pre-flight's warnings and notes (PF017 skipped rows, PF018, ...), for a real run as for a dry run
    (#26: `train` printed none); its errors too on a dry run (a real run stops on them with the full report)."""
    from fsdp_tune.errors import Severity
    from fsdp_tune.output.findings import format_findings

    errors = [f for f in findings if f.severity is Severity.ERROR]
    advisories = [f for f in findings if f.severity is not Severity.ERROR]
    if dry_run and errors:
        where = "the simulated node (with this machine's files and libraries)" if simulated else "this machine"
        typer.echo(f"{where} could not start it as it stands:", err=True)
        typer.echo(format_findings("this launch", errors, style).split("\n", 1)[-1], err=True)
    if advisories:
        typer.echo(format_findings("this launch", advisories, style), err=True)


def plan_cmd(
    ctx: typer.Context,
    config: Optional[str] = ConfigOpt,
    gpu: Optional[str] = typer.Option(
        None, "--gpu", help="h100 | h200 | a100 | 4090 (memory, TFLOP/s, link); default: this machine's GPU, else h100."
    ),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu_memory", "--gpu-memory", help="e.g. 80GiB, 24GB."),
    cpu: bool = typer.Option(False, "--cpu", help="Plan a CPU run (host memory per rank)."),
    trace: bool = typer.Option(
        False, "--trace", help="Also execute one step at the run's sizes in fake mode (torch; ~10-60 s) and compare."
    ),
    as_json: bool = typer.Option(False, "--json"),
    check: bool = typer.Option(False, "--check", help="Exit 1 when the launch as given does not fit (for scripts)."),
    debug: bool = DebugOpt,
) -> None:
    """Predict per-GPU and host memory and step time before launch, and what would make it fit.

    Exit codes: 0 it fits (or an option listed fits), 1 it does not fit and nothing fsdp-tune tried does (with
    --check: the launch as given does not fit), 2 bad config. Host RAM is judged against this machine when the
    plan is for it (--cpu, or no --gpu/--gpu_memory on a machine with NVIDIA GPUs: its smallest GPU is planned).

    Planned on the loading path the run would take (--loading auto|sharded|transformers, as for train).
    --trace runs the real model, PEFT, FSDP2 and TRL code of one step on fake tensors at the run's world size
    (a few decoder layers, extrapolated) and prints the traced peak and its categories beside the plan."""
    config, args = split_config(config, list(ctx.args))

    def run() -> None:
        from fsdp_tune.decide.derived import runs_on_cpu
        from fsdp_tune.output.plan import format_plan
        from fsdp_tune.planner.plan import memory_plan
        from fsdp_tune.validate import load

        cfg = load(config, args, launch=False).config  # a plan is not a launch: machine 0's address not asked
        on_cpu = runs_on_cpu(cfg, asked=cpu)  # the run the config describes, or a CPU plan asked for (--cpu)
        if trace:  # refused up front (TR001, TR002) rather than after the plan
            from fsdp_tune.trace import guard

            guard.check_settings(cfg, on_cpu=on_cpu)
            guard.check_versions(cfg.quantization.use_4bit_quantization)
        gpu_key, memory, host_gib = _plan_target(gpu, gpu_memory, on_cpu)
        result = memory_plan(cfg, gpu_key, memory, on_cpu=on_cpu, host_gib=host_gib)
        text = None if as_json else format_plan(result)
        if trace:
            from fsdp_tune.output.trace import compare, format_trace
            from fsdp_tune.trace.run import trace as run_trace  # the rank side: torch, only when asked

            result["trace"] = run_trace(cfg)
            result["trace"]["comparison"] = compare(result, result["trace"])
            text = text and text + "\n" + format_trace(result["trace"])
        typer.echo(json.dumps(result, indent=2) if as_json else text)
        if not (result["fits"] and result["host_fits"] is not False) and (check or not result["advice"]):
            raise typer.Exit(DOES_NOT_FIT)

    guard(run, debug)


def rows_cmd(
    ctx: typer.Context,
    config: Optional[str] = ConfigOpt,
    count: int = typer.Option(2, "-n", "--rows", help="How many rows of the training split, from the first."),
    debug: bool = DebugOpt,
) -> None:
    """Show the first training rows (of the first data source) as rank 0 trains on them: rendered, tokenized, each
    token in the loss or not.

    Takes what train takes (a config and flags); runs train's pre-flight of the data and rank 0's encoder, without
    torch and without launching. On a terminal the tokens in the loss are green and the rest dimmed; elsewhere the
    text is plain and the tokens in the loss stand between [[ and ]]."""
    config, args = split_config(config, list(ctx.args))

    def run() -> None:
        import sys

        from fsdp_tune.errors import UsageError
        from fsdp_tune.output.console import ConsoleStream
        from fsdp_tune.tools.rows import first_rows, format_rows

        if count < 1:
            raise UsageError(f"--rows {count}: at least 1", "--rows 2")
        described, shown = first_rows(config, args, count)
        tty = isinstance(sys.stdout, ConsoleStream) and sys.stdout.isatty()
        echo_out(format_rows(described, shown, tty))

    guard(run, debug)


DOES_NOT_FIT = 1  # plan's exit code: the launch does not fit, and nothing proposed fits (or --check)


def _plan_target(gpu: str | None, gpu_memory: str | None, on_cpu: bool) -> tuple[str, str | None, float | None]:
    """(the GPU to plan, its memory, this machine's available RAM when the plan is for this machine): a CPU run
    is; a GPU plan is when no --gpu/--gpu_memory names another card and this machine has NVIDIA GPUs (the
    smallest is planned, as train's memory pre-flight does)."""
    from fsdp_tune.decide.machine import available_ram_gib, probe
    from fsdp_tune.preflight.memory import planned_gpu

    if on_cpu:
        return gpu or "h100", gpu_memory, available_ram_gib()
    if gpu or gpu_memory:
        return gpu or "h100", gpu_memory, None
    machine = probe()
    cards = list(zip(machine.gpu_names, machine.gpu_memory_mib, strict=False))
    if not cards:
        return "h100", None, None
    return (*planned_gpu(cards), available_ram_gib())


def _plot(output_dir: str) -> None:
    """loss.png after a run; a plotting problem is a warning, the run itself succeeded."""
    from fsdp_tune.runfiles import LOSS_PLOT_NAME
    from fsdp_tune.tools.report import plot

    try:
        echo_out(f"  loss plot: {plot([output_dir], Path(output_dir) / LOSS_PLOT_NAME)}")
    except Exception as err:  # noqa: BLE001
        typer.echo(
            f"warning: loss.png not drawn ({type(err).__name__}: {err}); try `fsdp-tune report {output_dir}`", err=True
        )


def _dry_run_memory(planned, simulated: bool) -> None:
    """The planner's memory summary for a dry run, on the rank spec's loading path and the GPUs the ranks will use
    (the smallest, as train's memory pre-flight plans), host RAM judged when the machine is this one; a model it
    cannot see is a note, not a failure."""
    from fsdp_tune.decide.derived import runs_on_cpu
    from fsdp_tune.decide.machine import available_ram_gib
    from fsdp_tune.errors import UsageError
    from fsdp_tune.output.plan import format_plan
    from fsdp_tune.planner.plan import memory_plan
    from fsdp_tune.preflight.memory import planned_gpu, ranks_gpus
    from fsdp_tune.preflight.vision import largest

    cfg, spec = planned.config, planned.spec
    # the run the config describes: a GPU config on this CPU-only machine still gets its GPU plan (an H100's)
    on_cpu = runs_on_cpu(cfg)
    cards = ranks_gpus(spec, planned.machine) if spec.device == "cuda" and planned.machine else []
    key, memory = planned_gpu(cards) if cards else ("h100", None)
    host = None if simulated or not (cards or on_cpu) else available_ram_gib()
    try:
        image = largest(planned.counted)
        path = spec.loading.path
        facts = spec.model.facts  # as the rank spec decided them
        result = memory_plan(
            cfg, key, memory, on_cpu=on_cpu, loading=path, host_gib=host, image_size=image, model=facts
        )
    except UsageError as err:
        typer.echo(f"note: no memory plan: {err}")
        return
    typer.echo("memory plan (fsdp-tune plan):")
    typer.echo("\n".join("  " + line for line in format_plan(result).splitlines()))
