"""The plain way, for the launcher-overhead benchmark: a hand-written torchrun + SFTTrainer script with the
same model, data, seed, steps and FSDP2 settings as configs/demo_cpu.yaml, and the same loss (the answers
only: TRL's assistant_only_loss with a chat template marked for it).

Run: torchrun --standalone --nproc_per_node 2 benchmarks/plain_sft.py MODEL_DIR OUTPUT_DIR
On CPU it needs the same accelerate shim as fsdp-tune (without it accelerate silently trains unsharded).
PLAIN_MODE=ddp trains the same model with plain DDP (no sharding) for the memory comparison;
PLAIN_STEPS / PLAIN_BATCH / PLAIN_SEQ change the run's length and shape; PLAIN_FULL=1 trains every
weight (no LoRA), where sharding the optimizer state pays off.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from fsdp_tune.config.templates import CHATML_ANSWERS_MARKED  # plain data: no time to speak of

started = time.time()


def command(model_dir: str, output_dir: str, nproc: int = 2) -> list[str]:
    """The torchrun command line that runs this script (used by the benchmarks)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        __file__,
        model_dir,
        output_dir,
    ]


def main() -> None:
    model_dir, output_dir = sys.argv[1], sys.argv[2]
    ddp = os.environ.get("PLAIN_MODE") == "ddp"
    steps = int(os.environ.get("PLAIN_STEPS", "60"))
    batch = int(os.environ.get("PLAIN_BATCH", "8"))
    seq = int(os.environ.get("PLAIN_SEQ", "128"))
    if not ddp:
        os.environ["ACCELERATE_USE_FSDP"] = "true"
    # What a careful user would have to write by hand: accelerate's FSDP path on CPU (with transformers 5.24
    # the Trainer keeps the decoder-layer wrap policy under FSDP2; it swaps in PEFT's only on FSDP1).
    from fsdp_tune.worker import cpu_fsdp

    cpu_fsdp.install()
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from fsdp_tune.sources.data import locate
    from fsdp_tune.sources.mixture import Source

    files = {"train": locate(Source("builtin:demo-chat")).files["train"]}
    tok = AutoTokenizer.from_pretrained(model_dir)
    # TRL trains on the answers only (fsdp-tune's default) with a template that marks them: ChatML with
    # {% generation %} around each answer and its end-of-turn token, which a user would write by hand
    tok.chat_template = CHATML_ANSWERS_MARKED
    ds = load_dataset("json", data_files=files)["train"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32", attn_implementation="sdpa")
    fsdp = (
        {}
        if ddp
        else dict(
            fsdp=True,
            fsdp_config={
                "version": 2,
                "reshard_after_forward": True,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "state_dict_type": "SHARDED_STATE_DICT",
                "cpu_ram_efficient_loading": False,
                "activation_checkpointing": False,
            },
        )
    )
    args = SFTConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=0.005,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=min(5, steps),
        save_strategy="steps" if not ddp else "no",
        save_steps=30,
        eval_strategy="no",
        activation_checkpointing=False,
        seed=42,
        report_to="none",
        bf16=False,
        use_cpu=True,
        ddp_backend="gloo",
        max_length=seq,
        packing=False,
        assistant_only_loss=True,
        **fsdp,
    )
    first_step: list[float] = []

    class FirstStep(TrainerCallback):
        def on_step_end(self, *a, **k):
            if not first_step:
                first_step.append(time.time())

    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        peft_config=None
        if os.environ.get("PLAIN_FULL") == "1"
        else LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"),
        callbacks=[FirstStep()],
    )
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(output_dir, "plain_summary.json"), "w") as f:
            json.dump(
                {
                    "losses": losses,
                    "train_runtime_s": result.metrics["train_runtime"],
                    "time_to_first_step_s": first_step[0] - started,
                    "peak_rss_mib_rank0": rss,
                },
                f,
            )


if __name__ == "__main__":
    main()
