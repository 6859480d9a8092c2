"""Every text a person reads, by kind: findings.py (the error voice, the resolved settings), run.py (the
launch plan, the run summary), plan.py (the memory plan), tables.py (runs side by side, the environment),
data.py (the lines about the data). The ranks' console lines are worker/phases.py's and
worker/training/progress.py's."""
