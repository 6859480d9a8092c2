"""The training methods, one entry each: fsdp_tune/methods/<name>.py holds the method's torch-free row (its data, its
reference, its head, its step, its metrics, its TRL config and trainer by name) and fsdp_tune/worker/methods/<name>.py
its rank hook (the TRL classes, its data preparation, what its trainer needs under FSDP). The rest of the house reads
the row's traits, never a method's name (tests/unit/test_method_rows.py). A method is added as its two files and its
name in registry.py ENTRIES; its TRL config's fields come from training_fields.json
(scripts/gen_training_fields.py reads the rows).
The first entry is the default method."""
