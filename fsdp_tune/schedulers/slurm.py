"""A Job as an sbatch script: one `fsdp-tune train` a node under srun, the same line on every node.

Preemption as README "Preemption on a cluster" asks: `--signal=USR1@GRACE` signals every process of the step
(not `B:USR1`, the batch shell only) GRACE seconds before the time limit; the ranks finish the step and
checkpoint, fsdp-tune exits 143 and the script requeues the job (`--requeue` makes it requeueable), which then
continues with `--resume_from_checkpoint latest`. scancel and preemption send SIGTERM to the step and the batch
shell alike: the ranks checkpoint the same way within SLURM's KillWait, and the shell, killed, requeues nothing.
Every directive is one sbatch(1) documents (tests check them against its vendored option list).
"""

from __future__ import annotations

import re
import shlex

from fsdp_tune.schedulers import jobtext
from fsdp_tune.schedulers.job import Job

STOPPED = 143  # fsdp-tune's exit after a stop signal, the checkpoint written (errors.ExitCode.TERMINATED)
# what only the cluster's user knows: sbatch refuses these values until they are filled (README "Your cluster")
FILL = "FILL_ME"
PLACEHOLDERS = (("time", f"{FILL}_HH:MM:SS"), ("partition", f"{FILL}_PARTITION"), ("account", f"{FILL}_ACCOUNT"))
# a directive's value sbatch reads as written: sbatch splits #SBATCH lines at spaces and reads `"`, `\\` and `#`
# itself (not as a shell would); a folder spelled otherwise is left to the script's `cd`
PLAIN = re.compile(r"[A-Za-z0-9._/+@:,=-]+\Z")


def directives(job: Job) -> list[tuple[str, str]]:
    """(sbatch option, value) in the order written."""
    out = [
        ("job-name", job.name),
        *PLACEHOLDERS,
        ("nodes", str(job.nodes)),
        ("ntasks-per-node", "1"),
        ("cpus-per-task", str(job.cpus)),
        ("mem", f"{job.memory_gib}G"),
    ]
    if job.gpu:
        out.insert(3 + len(PLACEHOLDERS), ("gpus-per-node", str(job.procs_per_node)))
    out += [
        *([("chdir", job.workdir)] if PLAIN.match(job.workdir) else []),  # where relative paths resolve
        ("output", f"{job.name}-%j.out"),
        ("open-mode", "append"),  # a requeued attempt appends to the same log
        ("signal", f"USR1@{job.grace_s}"),
        ("requeue", ""),
    ]
    return out


def render(job: Job) -> str:
    jobtext.check_job(job)
    lines = ["#!/usr/bin/env bash\n", *(jobtext.comment(line) for line in _header(job))]
    lines += [f"#SBATCH --{name}" + (f"={value}" if value else "") + "\n" for name, value in directives(job)]
    line = " ".join(['"$FSDP_TUNE"', jobtext.shell_line(job.argv)])
    body = [
        "set -uo pipefail",
        f"# {FILL} (if the nodes need it): make fsdp-tune runnable here: `module load ...`, `source VENV/bin/activate`",
        "# or `conda activate ENV` (sbatch passes the environment it is run from: an activated one needs nothing),",
        "# or set FSDP_TUNE to its path; in a container: srun's --container-image (pyxis) on the srun line below",
        "# the Hugging Face cache on the shared folder: one download for every node and every attempt",
        *(jobtext.shell_default(k, v) for k, v in job.env.items()),
        jobtext.shell_default("FSDP_TUNE", "fsdp-tune"),
        f"cd -- {shlex.quote(job.workdir)} || exit 1",
        "# every node runs the same line; SLURM's variables tell each one its place (SLURM_NODEID, ...)",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {line}",
        "status=$?",
        f"# {STOPPED}: stopped by the USR1 before the time limit, checkpoint written: requeue to continue",
        f'if [ "$status" -eq {STOPPED} ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
        'exit "$status"',
    ]
    return "".join(lines) + "\n".join(body) + "\n"


def _header(job: Job) -> list[str]:
    if job.shared_given:
        shared = f"shared folder (output, checkpoints, Hugging Face cache): {job.shared}; output: {job.output_dir}"
    else:
        shared = (
            f"output, checkpoints and the Hugging Face cache under {job.shared}, the folder emitted from: not known "
            "to be shared (no --shared): every node must see it at this path"
        )
    return [
        "Written by `fsdp-tune train ... --emit slurm`; nothing was submitted. Submit: sbatch THIS_FILE",
        f"before that: fill the {FILL} values (--time; --partition and --account, or delete those lines where the "
        "cluster has defaults); sbatch refuses the file until then; and the environment line below if needed",
        *job.facts,
        shared,
        f"runs in {job.workdir}: the config and relative data paths resolve there",
        "HF_TOKEN, when the model or the push needs one, comes from the environment sbatch is run from",
    ]
