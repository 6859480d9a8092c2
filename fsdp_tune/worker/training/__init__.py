"""The training step: one row per method (methods.py), the trainer with fsdp-tune's saving, its callbacks."""
