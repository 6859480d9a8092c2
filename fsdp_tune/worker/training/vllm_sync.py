"""GRPO's vLLM generation with the adapter alone synced (GenerationSpec.weight_sync "adapter"). BY READING: no GPU and
no vLLM were available where this was written; the wiring is tested with stand-ins (tests/lib/test_grpo_pieces.py),
the generation itself never ran.

TRL 1.16's sync (vllm_generation.py _iter_named_params) merges the adapter into the base on every rank
(model.merge_adapter()) and streams the merged weights to vLLM, then unmerges: on a sharded 4-bit base the merge
cannot work (trl#5975, trl#6007, peft#2501), and on any base it rewrites every sharded weight twice a step. Here the
colocated vLLM engine is started with LoRA on (enable_lora, the adapter's rank) over the same base checkpoint, and
each sync gathers the trainable adapter tensors only, as the final save does (saving/save.py gather_trainable: a
collective), writes them as a PEFT adapter into a folder of this rank's, and points every later generate() at it
with a new LoRARequest: the base inside vLLM is never touched, the sharded base never merged. A stale adapter
(verl#3516) cannot be generated from: the request names the optimizer step it was gathered at.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from pathlib import Path

from fsdp_tune.worker.rank import rank
from fsdp_tune.worker.saving.save import gather_trainable, peft_keys, write_peft_adapter

VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM's max_lora_rank takes
FOLDER = "fsdp_tune_vllm_adapter"


def max_lora_rank(r: int) -> int:
    return next((v for v in VLLM_LORA_RANKS if v >= r), VLLM_LORA_RANKS[-1])


@contextlib.contextmanager
def lora_engine(r: int):
    """While GRPOTrainer builds its VLLMGeneration: vLLM's LLM started with LoRA on, for an adapter of rank r."""
    import trl.generation.vllm_generation as module

    original = module.LLM
    module.LLM = functools.partial(original, enable_lora=True, max_lora_rank=max_lora_rank(r), max_loras=1)
    try:
        yield
    finally:
        module.LLM = original


def lora_request(name: str, number: int, path: str):
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=number, lora_path=path)


class AdapterSync:
    """Replaces VLLMGeneration.sync_weights (colocate mode): every rank gathers the adapter and gives its own engine
    the folder it wrote; generate() carries the newest request."""

    def __init__(self, trainer, generation, output_dir: str, make_request=lora_request):
        self.trainer, self.generation, self.make_request = trainer, generation, make_request
        self.root = Path(output_dir) / FOLDER / f"rank-{rank()}"
        self.request = None
        self.folder: Path | None = None
        llm = generation.llm
        original = llm.generate

        @functools.wraps(original)
        def generate(*args, **kwargs):
            if self.request is None:
                raise RuntimeError("vLLM would generate before the adapter reached it (no sync yet)")
            kwargs["lora_request"] = self.request
            return original(*args, **kwargs)

        llm.generate = generate
        generation.sync_weights = self.sync

    def sync(self) -> None:
        trainer = self.trainer
        wrapped = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        keys = peft_keys(peft_model)
        state = gather_trainable(wrapped, also=frozenset(keys))  # a collective: every rank, the same order
        step = int(trainer.state.global_step)
        folder = self.root / f"step-{step}"
        write_peft_adapter(peft_model, state, folder, keys)
        self.request = self.make_request(f"policy-step-{step}", step + 1, str(folder))
        if self.folder is not None and self.folder != folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = folder
        self.generation.llm.reset_prefix_cache()
