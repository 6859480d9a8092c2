"""Schedulers (SLURM, SkyPilot, Kubeflow Trainer): where a node's topology comes from, and the job files that run
the validated launch on one. Torch-free, like the rest of the launcher side.

topology.py reads the variables each scheduler sets on a node (tables in variables.py) into the launch keys;
job.py decides a scheduler-neutral Job from a planned launch; slurm.py, skypilot.py and kubeflow.py each render
one (a row each in emitters.py; launch/emit.py plans the job). Nothing here submits anything.
"""
