"""A stand-in for srun inside an emitted sbatch script: one task on each of the job's nodes, here all on this
machine, each with the step variables srun sets (src/common/env.c: SLURM_STEP_NUM_NODES, SLURM_STEP_NUM_TASKS,
SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_PROCID, SLURM_LOCALID, SLURMD_NODENAME). The node names come from
FAKE_SRUN_HOSTS (space-separated, in SLURM_JOB_NODELIST's order), so this file expands no hostlist itself.
srun's own options (up to the command) are accepted only when srun documents them; --kill-on-bad-exit=1 is
honoured (a task that fails ends the others). Each task's output goes to FAKE_SRUN_LOGS/node-K.log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRUN_OPTIONS = set((Path(__file__).parents[1] / "fixtures/schedulers/slurm/srun_options.txt").read_text().split())


def main(argv: list[str]) -> int:
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        name = argv[i][2:].partition("=")[0]
        if name not in SRUN_OPTIONS:
            print(f"fake srun: unknown option {argv[i]}", file=sys.stderr)
            return 2
        i += 1
    command = argv[i:]
    hosts = os.environ["FAKE_SRUN_HOSTS"].split()
    logs = Path(os.environ["FAKE_SRUN_LOGS"])
    n = len(hosts)
    procs = []
    for rank, host in enumerate(hosts):
        env = dict(
            os.environ,
            SLURM_STEP_ID="0",
            SLURM_STEP_NUM_NODES=str(n),
            SLURM_STEP_NUM_TASKS=str(n),
            SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
            SLURM_NNODES=str(n),
            SLURM_NODEID=str(rank),
            SLURM_PROCID=str(rank),
            SLURM_LOCALID="0",
            SLURMD_NODENAME=host,
        )
        log = open(logs / f"node-{rank}.log", "w")  # noqa: SIM115 - closed by the child's exit
        procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    by_pid = {p.pid: k for k, p in enumerate(procs)}
    codes: dict[int, int] = {}
    while len(codes) < n:
        pid, status = os.wait()  # whichever task ends first
        if pid not in by_pid:
            continue
        codes[by_pid[pid]] = os.waitstatus_to_exitcode(status)
        if codes[by_pid[pid]] and "--kill-on-bad-exit=1" in argv[:i]:
            for k, other in enumerate(procs):
                if k not in codes:
                    other.kill()
    return max(codes.values(), key=abs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
