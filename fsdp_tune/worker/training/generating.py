"""What a generating method's trainer (GRPOTrainer, RLOOTrainer: the row's `generates`) needs under FSDP2 that TRL 1.16
does not do, mixed into its class (its hook: worker/methods/<name>.py); both trainers generate, score and keep their
reference the same way (TRL's rloo_trainer.py is grpo_trainer.py's generation and reference, with its own loss):

Generation that cannot hang. TRL generates with the policy's own generate() on every rank; under FSDP2 each decoding
step's forward all-gathers every unit, so a rank whose completions all ended (EOS, or max_new_tokens) must keep
stepping until every rank has (transformers' synced_gpus). transformers turns it on by itself only when
is_fsdp_managed_module(model) sees `_is_fsdp_managed_module`, a mark torch 2.13's fully_shard puts on the modules it
manages "for Dynamo" (torch/distributed/fsdp/_fully_shard/_fully_shard.py), not a promise. Without it, the rank that
finished first goes on to TRL's gather of the completion lengths while the other is still all-gathering a unit: on
gloo the run aborted ("Received data size doesn't match expected size. Is there a distributed collective mismatch",
seen here with synced_gpus forced off and one rank stopped after 2 tokens); on NCCL, by reading, it waits until the
collective timeout. So the rank spec says when to sync (GenerationSpec.synced: more than one rank, on the sharded
path) and the model's generate() is called with synced_gpus as it says, whatever the libraries' marks. Where the
launcher planned room for it (GenerationSpec.weights "gathered"), the model is all-gathered once around each
generation instead of once per token, and no forward inside the phase calls a collective, so the ranks need not step
together (training/generation.py).

The reference, as the adapter switched off. Given a PEFT model (sharded loading applied LoRA before FSDP, or a
starting adapter did) and beta > 0, the trainer adds an adapter "ref" and copies "default" into it: on a sharded
model the new weights are plain tensors beside DTensors (the copy fails, and the adapter would sit outside FSDP's
units). For a fresh adapter (lora_B zero) the reference is exactly the base, so the trainer is built with beta 0 (no
"ref" adapter, no reference model) and given its beta afterwards: its reference forwards then run with the adapter
disabled on the same sharded model (TRL's use_adapter(model, None)). A starting adapter as the reference is a frozen
"ref" copy made before sharding, as DPO's (loading/reference.py; GenerationSpec.reference "ref_adapter").
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from fsdp_tune.worker import faults
from fsdp_tune.worker.training.generation import GenerationClock, install
from fsdp_tune.worker.training.rewards import reward_kwargs
from fsdp_tune.worker.training.vllm_sync import AdapterSync, lora_engine


def generating_kwargs(spec, tokenizer, step) -> dict[str, Any]:
    """A generating method's trainer arguments beyond the recipe's: its rewards, and this mixin's own."""
    rank = spec.lora.r if spec.lora else None
    return {**reward_kwargs(spec, tokenizer, step), "generating": spec.generating, "lora_rank": rank}


class GeneratingOnFsdp:
    """Mixed into a generating method's trainer before it (after FsdpSaving): synced generation and the
    disabled-adapter reference, as the rank spec's GenerationSpec says."""

    def __init__(self, *args, generating, lora_rank: int | None = None, **kwargs):
        self.generating = generating
        config = kwargs["args"]
        beta = config.beta
        if generating.reference == "adapter_disabled":
            config.beta = 0.0  # no "ref" adapter: the reference is the base, the adapter switched off
        vllm = generating.generation == "vllm"
        try:
            with lora_engine(lora_rank or 8) if vllm else contextlib.nullcontext():
                super().__init__(*args, **kwargs)
        finally:
            config.beta = beta
        self.beta = beta
        if vllm:  # by reading: the adapter alone reaches the colocated engine (training/vllm_sync.py)
            if generating.weight_sync != "adapter":
                raise ValueError(f"vLLM weight sync {generating.weight_sync!r}: this fsdp-tune syncs the adapter alone")
            AdapterSync(self, self.vllm_generation, config.output_dir)
        faults.shorten_generation(self.model)  # test-only: this rank's completions end early
        self.generation_clock = GenerationClock()
        if not vllm:  # the spec's weights: gathered once per generation, or sharded (training/generation.py)
            install(self.model, generating.weights, generating.synced, self.generation_clock)

    def _generate_and_score_completions(self, inputs):
        """TRL's, timed: its generate() calls (the clock) and the rest (the rewards, the reference's and old
        policy's log-prob passes) logged as timing/generation_s and timing/scoring_s beside TRL's step_time, which
        holds both and the training: the step's split in metrics.jsonl and the summary (config/methods.py)."""
        self.generation_clock.take()
        started = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        total = time.perf_counter() - started
        generation = self.generation_clock.take()
        metrics = self._metrics["train" if self.model.training else "eval"]
        if self.generating.generation != "vllm":  # vLLM's generation is not on the clock: all of it would be scoring
            metrics["timing/generation_s"].append(generation)
            metrics["timing/scoring_s"].append(total - generation)
        return out
