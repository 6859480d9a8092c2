"""`fsdp-tune train ... --emit slurm|skypilot|kubeflow [-o FILE]`: the validated launch as that scheduler's job.

Decided as the nodes will decide it: the line every node runs is planned here (plan_run) with the variables the
scheduler would give node 0 (schedulers/emitters.py), so its topology goes through schedulers/topology.py exactly
as on a node, on a simulated node of the job's GPUs (`--gpu`, default h100: the memory plan and its PF050 are that
node's). A plan that does not fit, or a setting the scheduler says itself or cannot say (PF095), is refused;
nothing is submitted. The rendering is schedulers/slurm.py, skypilot.py, kubeflow.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fsdp_tune.config.run_folder import output_dir_as_given, output_dir_origin
from fsdp_tune.errors import PreflightError, Severity, UsageError
from fsdp_tune.schedulers import emitters, jobtext
from fsdp_tune.schedulers import job as jobs

Echo = Callable[[str], None]
DEFAULT_GPU = "h100"  # as `plan` plans without --gpu


def emit(
    kind: str,
    config: str | None,
    args: list[str],
    echo: Echo,
    gpu: str | None = None,
    shared: str | None = None,
    image: str | None = None,
) -> jobs.Job:
    """The job for `kind`, decided from `config` and `args` as `train` takes them; PreflightError (PF095, PF050)
    when it cannot be emitted."""
    from fsdp_tune.decide import simulate
    from fsdp_tune.decide.derived import runs_on_cpu
    from fsdp_tune.decide.machine import probe
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.validate import check

    row = emitters.EMITTERS.get(kind)
    if row is None:
        raise UsageError(f"--emit {kind}: unknown", f"one of: {', '.join(emitters.EMITTERS)}")
    # the job's size, before any scheduler says it; the rules run once, on the job's own command line (plan_run)
    cfg = check(config, args, rules=False).config
    nodes, per, on_cpu = cfg.launch.num_machines, cfg.launch.nproc_per_node, runs_on_cpu(cfg)  # as written
    local_out = output_dir_as_given(cfg)  # config/run_folder.py: train's default when none is given
    origins = _refuse_controls(cfg, config, args, local_out, shared, image)  # before planning writes anything
    name = emitters.job_name(local_out)
    if refused := emitters.refusals(row, kind, cfg, args, image):
        raise PreflightError(refused)
    shared = os.path.abspath(shared) if shared and row.mount is None else shared  # SLURM's: a folder
    where = shared or (os.getcwd() if row.mount is None else f"{name}-shared")
    out = emitters.shared_output_dir(row, kind, local_out, where)
    workdir, node_config = emitters.slurm_folders(shared, config) if row.mount is None else (os.getcwd(), config)
    node_config = emitters.node_config(row, kind, node_config)
    sized = [*jobs.without(args, ("num_processes", "num_machines", "resume_from_checkpoint", "output_dir"))]
    sized += ["--num_processes", str(nodes * per), "--num_machines", str(nodes)]
    key = gpu or DEFAULT_GPU
    machine = probe() if on_cpu else simulate.gpu_node(key, per)
    env = row.node0(name, nodes, per, not on_cpu)
    planned = plan_run(config, [*sized, "--output_dir", local_out], echo, machine=machine, env=env)
    plan = _plan(planned, key, on_cpu, echo)
    placed = dict(name=name, shared=where, output_dir=out, workdir=workdir, config=node_config, image=image)
    placed |= dict(args=(*sized, "--output_dir", out, "--resume_from_checkpoint", "latest"), origins=origins)
    job = _job(row, kind, planned, plan, gpu=None if on_cpu else key, shared_given=shared is not None, **placed)
    for line in emitters.local_files(row, kind, job, config):
        echo(line)
    return job


def _job(row, kind: str, planned, plan: dict, gpu: str | None, **placed) -> jobs.Job:
    """The Job: sized by the plan, placed as emit() decided (where the output, config, shared folder and data
    are), the data paths checked (PF096) before they reach it."""
    cfg = planned.config
    nodes, per = cfg.launch.num_machines, cfg.launch.nproc_per_node
    mount, grace = row.mount or placed["shared"], jobs.grace_s(plan, int(plan.get("trainable_params") or 0))
    gpu_name = plan.get("device") if gpu else None
    data = _data_paths(planned)
    jobtext.refuse_controls([(*_data_origin(cfg, path), path) for path in data])
    return jobs.Job(
        scheduler=kind,
        nodes=nodes,
        procs_per_node=per,
        gpu=gpu,
        gpu_name=gpu_name,
        memory_gib=jobs.memory_gib(plan),
        cpus=per * (1 + int(cfg.training.get("dataloader_num_workers") or 0)),
        grace_s=grace,
        mount=mount,
        env={"HF_HOME": f"{mount.rstrip('/')}/hf-cache"},
        facts=jobs.facts(plan, nodes, per, gpu_name, grace),
        data_paths=data,
        pins=_pins(),
        **placed,
    )


def _data_paths(planned) -> tuple[str, ...]:
    """The local data files and folders the run reads, as the user named them (a folder, not its shards; the
    files of `path: json` with data_files); builtin data ships with fsdp-tune on every node."""
    from fsdp_tune.sources.data import BUILTIN, LOADERS

    out: list[str] = []
    for source in planned.spec.data.sources:
        if source.loader is None or source.path in BUILTIN:
            continue
        out += [f for files in source.files.values() for f in files] if source.path in LOADERS else [source.path]
    return tuple(dict.fromkeys(out))


def _data_origin(cfg, path: str) -> tuple[str, str]:
    """(key, source) a data path came from, as the user wrote it."""
    name = "data.dataset_name" if path == cfg.data.dataset_name else "data.datasets"
    origin = cfg.origin(name) or cfg.origin("data.data_files")
    return (origin.key, origin.source) if origin else ("data path", "the config")


def _pins() -> dict[str, str]:
    """fsdp-tune and torch as installed here (the launch was validated with them), without importing torch; a
    local build label (+cpu, +cu128) dropped: the nodes' pip picks their own build of that version."""
    from fsdp_tune.rundir.manifest import versions

    found = versions()
    return {name: found[name].split("+")[0] for name in ("fsdp-tune", "torch") if found.get(name)}


def _refuse_controls(cfg, config, args, output_dir: str, shared, image) -> dict[str, tuple[str, str]]:
    """PF096 (jobtext) for any value bound for the job file that holds a control character, before the plan
    touches the output folder; where the job's own fields came from, as the user wrote them (field -> (key,
    source): jobtext names them when it refuses one)."""
    out = output_dir_origin(cfg)
    values = [("--config", "command line", config), ("--shared", "command line", shared)]
    values += [("--image", "command line", image), ("the folder emitted from", "cwd", str(Path.cwd()))]
    values += [(*out, output_dir)]
    jobtext.refuse_controls([*values, *jobtext.flag_values(args)])
    return {"output_dir": out}


def _plan(planned, key: str, on_cpu: bool, echo: Echo) -> dict:
    """The memory plan the job is sized by; its PF050 (a GPU it does not fit) refuses the job. What else this
    machine's pre-flight found is said, not refused: the nodes check again before they start."""
    from fsdp_tune.planner.plan import memory_plan

    memory = [f for f in planned.machine_findings if f.rule == "PF050" and f.severity is Severity.ERROR]
    if memory:
        raise PreflightError(memory)
    for f in planned.machine_findings:
        if f.severity is Severity.ERROR:
            echo(f"note: on this machine {f.rule} {f.key}: {f.message} (the nodes check again when they start)")
    spec = planned.spec
    return memory_plan(planned.config, key, on_cpu=on_cpu, loading=spec.loading.path, model=spec.model.facts)
