"""did-you-mean for unknown keys and flags.

First the names other fine-tuning tools give a setting (axolotl, LLaMA-Factory, torchtune, and the shorthand people
type): a user coming from one writes `--lr` or `--micro_batch_size`, and spelling distance alone would point them at
`--r` or `--max_steps`. Such a name stays unknown (FT001: it is never read in place of ours, since a name means what
its tool means and the values can differ, LLaMA-Factory's `quantization_bit 4` for one); the hint names our flag and
whose name it was. Then the closest known name by spelling, then a known name the given one ends with or is the end
of (a prefix another tool puts on a key: `fsdp_`, `parallelism_config_`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# another tool's name (lowercase, underscores) -> (the setting's name here, whose name it is); the targets are flags
# (tests/unit/test_suggest.py checks each one is), and a recipe section's key of the same name where it has one
OTHER_NAMES: dict[str, tuple[str, str]] = {
    "model": ("model_name_or_path", "a shorthand"),
    "model_name": ("model_name_or_path", "a shorthand"),
    "model_id": ("model_name_or_path", "a shorthand"),
    "model_path": ("model_name_or_path", "a shorthand"),
    "base_model": ("model_name_or_path", "axolotl's"),
    "lr": ("learning_rate", "torchtune's"),
    "epochs": ("num_train_epochs", "torchtune's"),
    "num_epochs": ("num_train_epochs", "axolotl's"),
    "batch_size": ("per_device_train_batch_size", "torchtune's"),
    "micro_batch_size": ("per_device_train_batch_size", "axolotl's"),
    "train_batch_size": ("per_device_train_batch_size", "a shorthand"),
    "eval_batch_size": ("per_device_eval_batch_size", "axolotl's"),
    "grad_accum": ("gradient_accumulation_steps", "a shorthand"),
    "gradient_accumulation": ("gradient_accumulation_steps", "a shorthand"),
    "sequence_len": ("max_seq_len", "axolotl's"),
    "cutoff_len": ("max_seq_len", "LLaMA-Factory's"),
    "seq_len": ("max_seq_len", "a shorthand"),
    "lora_rank": ("lora_r", "LLaMA-Factory's and torchtune's"),
    "rank": ("lora_r", "a shorthand"),
    "lora_target": ("lora_target_modules", "LLaMA-Factory's"),
    "lora_attn_modules": ("lora_target_modules", "torchtune's"),
    "dataset": ("dataset_name", "LLaMA-Factory's"),
    "data": ("dataset_name", "a shorthand"),
    "data_path": ("dataset_name", "a shorthand"),
    "train_file": ("dataset_name", "a shorthand"),
    "val_set_size": ("test_split_size", "axolotl's"),
    "val_size": ("test_split_size", "LLaMA-Factory's"),
    "optimizer": ("optim", "axolotl's"),
    "lr_scheduler": ("lr_scheduler_type", "axolotl's"),
    "flash_attention": ("use_flash_attn", "axolotl's"),
    "flash_attn": ("use_flash_attn", "LLaMA-Factory's"),
    "sample_packing": ("packing", "axolotl's"),
    "quantization_bit": ("load_in_4bit", "LLaMA-Factory's"),
    "stage": ("method", "LLaMA-Factory's"),
    "pref_beta": ("beta", "LLaMA-Factory's"),
    "template": ("chat_template_format", "LLaMA-Factory's"),
    "compile": ("torch_compile", "torchtune's"),
    "out_dir": ("output_dir", "a shorthand"),
    "resume": ("resume_from_checkpoint", "a shorthand"),
}


def did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    known = list(known)
    norm = name.lower().replace("-", "_")
    other = OTHER_NAMES.get(norm)
    if other is not None and other[0] in known:
        return f"did you mean `{prefix}{other[0]}`? (`{norm}` is {other[1]} name)"
    matches = difflib.get_close_matches(norm, known, n=1, cutoff=0.6)
    if not matches:
        # a key with a prefix the other tool uses (fsdp_/parallelism_config_) still deserves a hint
        matches = [k for k in known if norm.endswith(k) or k.endswith(norm)][:1]
    return f"did you mean `{prefix}{matches[0]}`?" if matches else ""
