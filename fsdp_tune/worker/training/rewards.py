"""GRPO's reward functions on the ranks, from the rank spec's RewardSpecs: built-ins (rewards/builtin.py), the
user's functions (rewards/load.py), each checked on every call (rewards/guard.py: a failure or a result GRPO cannot
use stops the run in one line); reward models as TRL takes them, a model and its tokenizer.

A --method reward run is its adapter on its base, loaded as a sequence classifier with one label and merged: a
small unsharded copy on every rank, in inference mode (TRL's _calculate_rewards calls it under inference_mode).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from fsdp_tune.decide.spec import RankSpec, RewardSpec
from fsdp_tune.rewards.builtin import make
from fsdp_tune.rewards.guard import guarded
from fsdp_tune.rewards.load import load_function
from fsdp_tune.runfiles import RESOLVED_NAME

RAM_EFFICIENT = "FSDP_CPU_RAM_EFFICIENT_LOADING"  # transformers' rank-0-only loading under FSDP (distributed/fsdp.py)


def reward_kwargs(spec: RankSpec, tokenizer, step=lambda: None) -> dict[str, Any]:
    """GRPOTrainer's reward_funcs and reward_processing_classes for the spec's rewards. `step()`: the global step,
    for the guard's messages."""
    if spec.generating is None:
        return {}
    length = spec.generating.max_completion_length or 512  # None: generation's own limit; the length rewards need one
    funcs, classes = [], []
    for reward in spec.generating.rewards:
        if reward.kind in ("reward_run", "reward_model"):
            model, reward_tokenizer = reward_model(reward, spec)
            funcs.append(model)
            classes.append(reward_tokenizer)
            continue
        func = make(reward.target, length) if reward.kind == "builtin" else load_function(reward)
        where = "built-in" if reward.kind == "builtin" else reward.written
        funcs.append(guarded(func, reward.name, where, step))
        classes.append(None)
    return {"reward_funcs": funcs, "reward_processing_classes": classes}


def reward_model(reward: RewardSpec, spec: RankSpec):
    """(a sequence classifier scoring with one number, its tokenizer), opened through the loader door
    (worker/loading/door.py) with the run's trust_remote_code."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from fsdp_tune.config.folders import read_json
    from fsdp_tune.worker.loading.door import open_adapter, open_model, open_tokenizer

    folder = Path(reward.target)
    trust = spec.model.trust_remote_code
    tokenizer = open_tokenizer(str(folder), trust)
    if reward.kind == "reward_model":
        model = open_model(AutoModelForSequenceClassification, str(folder), trust, num_labels=1)
    else:
        base = read_json(folder / RESOLVED_NAME)["spec"]["model"]
        dtype = getattr(torch, base.get("dtype") or "float32", torch.float32)
        auto = AutoModelForSequenceClassification
        with _whole_on_this_rank():
            model = open_model(auto, base["name_or_path"], trust, num_labels=1, dtype=dtype)
        if len(tokenizer) != model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8)  # as the reward run grew it
        model = open_adapter(model, folder).merge_and_unload()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.requires_grad_(False)
    return model.eval(), tokenizer  # TRL places it on the rank's device (accelerator.prepare_model)


@contextlib.contextmanager
def _whole_on_this_rank():
    """transformers' FSDP loading (FSDP_CPU_RAM_EFFICIENT_LOADING, from the rank spec's environment) switched off
    while a reward run's base loads: under it, every rank but local rank 0 leaves the weights the checkpoint lacks on
    the meta device for FSDP to broadcast (modeling_utils _move_missing_keys_from_meta_to_device). A causal LM's
    files lack the classifier's `score` head, and this copy is never sharded: PEFT's loading of the adapter's `score`
    (modules_to_save) then stopped rank 1 with "Cannot copy out of meta tensor". Each rank loads it whole, as a
    merged reward model loads (its files hold `score`), and the adapter's saved head replaces the new one."""
    before = os.environ.get(RAM_EFFICIENT)
    os.environ[RAM_EFFICIENT] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ[RAM_EFFICIENT]
        else:
            os.environ[RAM_EFFICIENT] = before
