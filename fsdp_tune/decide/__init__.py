"""Every decision a run's ranks execute, made once and torch-free: the machine the run is for (machine.py), what
follows from the config on it (derived.py: precision, dtypes, checkpointing, offload, the method's traits), the
loading path (loading.py), and the typed rank spec those decisions become (spec.py, rank.py). The rules, the
planner, the trace and the launcher read these; none re-derives them."""
