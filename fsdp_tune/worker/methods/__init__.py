"""Each training method's rank hook, one module per method named as its entry (fsdp_tune/methods/<name>.py holds its
row): `HOOK`, its TRL config and trainer classes, its data preparation and what its trainer needs beyond what the
recipe passes (worker/training/methods.py Method, method_of)."""
