"""A generating method's rewards (GRPO, RLOO): the built-in ones (builtin.py), what a `--reward_funcs` entry names
(resolve.py), the check that runs the user's function on one row before launch (probe.py) and the check of every
result it returns (guard.py). Pure Python: the launcher imports these without torch; the ranks build the callables
(worker/training/rewards.py)."""
