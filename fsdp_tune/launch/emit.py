"""`fsdp-tune train ... --emit slurm|skypilot|kubeflow [-o FILE]`: the validated launch as that scheduler's job.

Decided as the nodes will decide it: the line every node runs is planned here (plan_run) with the variables the
scheduler would give node 0 (schedulers/emitters.py), so its topology goes through schedulers/topology.py exactly
as on a node, on a simulated node of the job's GPUs (`--gpu`, default h100: the memory plan and its PF050 are that
node's). A plan that does not fit, or a setting the scheduler says itself or cannot say (PF095), is refused;
nothing is submitted. The rendering is schedulers/slurm.py, skypilot.py, kubeflow.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fsdp_tune.config.run_folder import output_dir_as_given
from fsdp_tune.errors import PreflightError, Severity, UsageError
from fsdp_tune.schedulers import emitters
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
    cfg = check(config, args).config  # the job's size, before any scheduler says it
    nodes, per, on_cpu = cfg.launch.num_machines, cfg.launch.nproc_per_node, runs_on_cpu(cfg)  # as written
    local_out = output_dir_as_given(cfg)  # config/run_folder.py: train's default when none is given
    name = emitters.job_name(local_out)
    refused = emitters.refusals(row, kind, cfg, args, image)
    if refused:
        raise PreflightError(refused)
    where = shared or (str(Path.cwd()) if row.mount is None else f"{name}-shared")
    out = emitters.shared_output_dir(row, kind, local_out, where)
    node_config = emitters.node_config(row, kind, config)
    sized = [*jobs.without(args, ("num_processes", "num_machines", "resume_from_checkpoint", "output_dir"))]
    sized += ["--num_processes", str(nodes * per), "--num_machines", str(nodes)]
    key = gpu or DEFAULT_GPU
    machine = probe() if on_cpu else simulate.gpu_node(key, per)
    env = row.node0(name, nodes, per, not on_cpu)
    planned = plan_run(config, [*sized, "--output_dir", local_out], echo, machine=machine, env=env)
    plan = _plan(planned, key, on_cpu, echo)
    mount = row.mount or where
    grace = jobs.grace_s(plan, int(plan.get("trainable_params") or 0))
    gpu_name = None if on_cpu else plan.get("device")
    return jobs.Job(
        scheduler=kind,
        name=name,
        nodes=nodes,
        procs_per_node=per,
        gpu=None if on_cpu else key,
        gpu_name=gpu_name,
        memory_gib=jobs.memory_gib(plan),
        cpus=per * (1 + int(cfg.training.get("dataloader_num_workers") or 0)),
        grace_s=grace,
        config=node_config,
        args=(*sized, "--output_dir", out, "--resume_from_checkpoint", "latest"),
        output_dir=out,
        shared=where,
        mount=mount,
        env={"HF_HOME": f"{mount.rstrip('/')}/hf-cache"},
        image=image,
        workdir=str(Path.cwd()),
        facts=jobs.facts(plan, nodes, per, gpu_name, grace),
    )


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
    return memory_plan(planned.config, key, on_cpu=on_cpu, loading=planned.spec.loading.path)
