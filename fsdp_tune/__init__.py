"""fsdp-tune: check, launch and save FSDP2 + LoRA/QLoRA/DoRA fine-tuning runs.

Importing this package (and `fsdp_tune.cli`) must stay cheap: torch and the Hugging Face stack are
imported only inside the per-rank worker and the few commands that need them.
"""

__version__ = "0.1.0"
