"""Build a small Llama-architecture model and tokenizer locally, reproducibly (no hub, no weights).

The demo and the tests cannot download anything, so `builtin:tiny-llama` (and `builtin:small-llama`,
~120M parameters, for memory benchmarks) are made here: a BPE tokenizer trained on the shipped demo
data plus a randomly initialised LlamaForCausalLM with a fixed seed. Run as
`python -m fsdp_tune.models.tiny NAME OUT_DIR`; the launcher does this once and caches the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from importlib import resources
from pathlib import Path

from fsdp_tune.config.templates import CHATML
from fsdp_tune.sources.builtin import PRESETS

SEED = 1234


def _corpus() -> list[str]:
    texts = []
    base = resources.files("fsdp_tune.assets").joinpath("demo_chat")
    for split in ("train", "test"):
        for line in base.joinpath(f"{split}.jsonl").read_text().splitlines():
            texts += [m["content"] for m in json.loads(line)["messages"]]
    return texts + ["system user assistant"]


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", CHATML["pad_token"], CHATML["bos_token"], CHATML["eos_token"]]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token=CHATML["pad_token"],
        bos_token=CHATML["bos_token"],
        eos_token=CHATML["eos_token"],
    )
    fast.chat_template = CHATML["template"]
    return fast


def build(name: str, out_dir: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if name not in PRESETS:
        raise SystemExit(f"unknown builtin model {name!r}; known: {', '.join(PRESETS)}")
    preset = dict(PRESETS[name])
    tokenizer = build_tokenizer(preset["vocab_size"])
    # the preset's vocabulary size is the model's (rows past the tokenizer's merges stay unused, as in
    # real models), so the planner's count from the preset is exact
    preset["vocab_size"] = max(len(tokenizer), preset["vocab_size"])
    preset.setdefault("max_position_embeddings", 2048)
    config = LlamaConfig(
        **preset,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    if torch.cuda.is_available() and preset["hidden_size"] >= 2048:
        # billion-parameter presets: initialise in bf16 on the GPU (seconds) instead of fp32 on CPU (minutes)
        config.dtype = "bfloat16"
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).to(torch.bfloat16)
    else:
        model = LlamaForCausalLM(config)
    out = Path(out_dir)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)  # complete or absent: a crash never leaves a half-built model behind
    except OSError:
        if not out.is_dir():  # another process built it first: same seed, same weights
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(build(sys.argv[1], sys.argv[2]))
