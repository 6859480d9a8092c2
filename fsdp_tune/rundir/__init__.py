"""The run folder: who owns it (ownership.py), what it holds and what a run may do with it (outdir.py), the
manifest of what ran (manifest.py), checkpoints and their markers (checkpoints.py), and the pickles a resume would
load, read without running them (pickles.py). File names are runfiles.py's."""
