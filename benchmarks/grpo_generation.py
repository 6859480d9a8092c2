"""GRPO's generation, three ways side by side in one torchrun launch on 2 CPU ranks (#52): TRL's own GRPOTrainer under
plain DDP (the unsharded reference), fsdp-tune on the sharded policy (`--grpo_generation sharded`: every FSDP unit
all-gathered again per generated token) and fsdp-tune gathered once per generation (`--grpo_generation gathered`).
The same tiny model (builtin:tiny-llama), prompts, seed, LoRA, steps and sampling (top_k 1: the three decode the same
tokens as far as their numerics agree), one after another in the same processes.

Each generation is timed where TRL makes it (GRPOTrainer._generate_single_turn, patched on the class: the fsdp-tune
paths' all-gathers and synced stepping are inside it), with the completion tokens it returned; rank 0's figures,
medians over the steps (the first generation, with its warm-up, left out). Run: `python -m benchmarks grpo_generation`.

Driver (what the launch runs): torchrun --standalone --nproc_per_node 2 benchmarks/grpo_generation.py OUT MODEL DATA
RESOLVED_SHARDED RESOLVED_GATHERED
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = 7  # one generation per step (per_device 8 x 2 ranks, 8 per prompt); the first is the warm-up
COMPLETION = 32
PATHS = ("ddp", "sharded", "gathered")
CONFIG = """# python -m benchmarks grpo_generation (written by benchmarks/grpo_generation.py)
launch: {{num_processes: 2, use_cpu: true, mixed_precision: "no"}}
fsdp:
  version: 2
  reshard_after_forward: true
  auto_wrap_policy: TRANSFORMER_BASED_WRAP
  cpu_ram_efficient_loading: false
model: {{model_name_or_path: builtin:tiny-llama}}
data: {{dataset_name: {data}, splits: [train], max_seq_len: 96}}
lora: {{use_peft_lora: true, lora_r: 8, lora_alpha: 16, lora_dropout: 0.0, lora_target_modules: all-linear}}
training:
  max_steps: {steps}
  per_device_train_batch_size: 8
  num_generations: 8
  max_completion_length: {completion}
  top_k: 1
  learning_rate: 0.005
  logging_steps: 1
  save_strategy: "no"
  gradient_checkpointing: false
  seed: 7
  report_to: none
"""


def shorter(completions, **kwargs) -> list[float]:
    """The reward of every path: shorter completions score higher (characters)."""
    return [-len(c) / 100 for c in completions]


def run() -> dict:
    from fsdp_tune.launch import torchrun
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.sources.builtin import materialize

    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-grpo-gen-"))
    data = work / "prompts.jsonl"
    words = "cats dogs suns trees rivers houses cars moons".split()
    data.write_text("".join(json.dumps({"prompt": f"Tell me about {w}."}) + "\n" for w in words * 8))
    config = work / "grpo.yaml"
    config.write_text(CONFIG.format(data=data, steps=STEPS, completion=COMPLETION))
    reward = f"{Path(__file__).resolve()}:shorter"
    resolved = []
    for path in PATHS[1:]:
        flags = ["--method", "grpo", "--reward_funcs", reward, "--grpo_generation", path]
        planned = plan_run(str(config), [*flags, "--output_dir", str(work / path)], lambda _: None)
        assert planned.spec.generating.weights == path, planned.spec.generating
        resolved.append(torchrun.prepare(planned.config, planned.spec, planned.run_id).resolved_path)
    model = str(materialize("tiny-llama"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    started = time.time()
    proc = subprocess.run([*cmd, str(work), model, str(data), *resolved], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"the GRPO generation benchmark failed:\n{proc.stderr[-4000:]}")
    timings = json.loads((work / "generation_timings.json").read_text())
    return summarize(timings, time.time() - started, work)


def summarize(timings: dict, wall_s: float, work: Path) -> dict:
    rows = {}
    for path in PATHS:
        calls = timings[path][1:]  # the first generation warms up
        rows[path] = {
            "generations": len(calls),
            "median_s": statistics.median(c["seconds"] for c in calls),
            "median_tokens": statistics.median(c["tokens"] for c in calls),
            "median_tokens_per_s": statistics.median(c["tokens"] / c["seconds"] for c in calls),
        }
    ddp = rows["ddp"]["median_s"]
    return {
        "machine_note": "2 CPU ranks (gloo) on a machine shared with other sessions: compare within this run only",
        "model": "builtin:tiny-llama (1.3M parameters, 4 layers), LoRA r=8 all-linear, fp32",
        "settings": f"{STEPS} steps, 8 completions per rank per generation, up to {COMPLETION} tokens, top_k 1",
        "wall_s": round(wall_s, 1),
        "paths": rows,
        "time_over_ddp": {p: rows[p]["median_s"] / ddp for p in PATHS},
        "gathered_within_1_3x_of_ddp": rows["gathered"]["median_s"] / ddp <= 1.3,
        "work": str(work),
    }


def as_markdown(r: dict) -> str:
    lines = ["| path | generation (median s) | completion tokens | tokens/s (rank 0) | time vs DDP |"]
    lines.append("|---|---|---|---|---|")
    names = {"ddp": "TRL GRPOTrainer, plain DDP", "sharded": "fsdp-tune, sharded", "gathered": "fsdp-tune, gathered"}
    for path, row in r["paths"].items():
        lines.append(
            f"| {names[path]} | {row['median_s']:.3f} | {row['median_tokens']:.0f} | "
            f"{row['median_tokens_per_s']:.0f} | {r['time_over_ddp'][path]:.2f}x |"
        )
    return "\n".join(lines)


# ---- the driver: runs on each rank -----------------------------------------------------------------------------


def _timed_generation(record: list) -> None:
    """GRPOTrainer._generate_single_turn timed on the class (fsdp-tune's trainer subclasses it)."""
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_single_turn

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        out = original(self, *args, **kwargs)
        record.append({"seconds": time.perf_counter() - started, "tokens": sum(len(ids) for ids in out[0])})
        return out

    GRPOTrainer._generate_single_turn = timed


def _ddp(model_dir: str, data: str, out: str) -> None:
    """TRL's own GRPO, as its documentation runs it, with plain DDP (no fsdp config: accelerate's MULTI_CPU)."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    args = GRPOConfig(
        output_dir=out, max_steps=STEPS, per_device_train_batch_size=8, num_generations=8, top_k=1,
        max_completion_length=COMPLETION, learning_rate=0.005, logging_steps=1, save_strategy="no",
        gradient_checkpointing=False, seed=7, report_to="none", use_cpu=True,
    )  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    ds = load_dataset("json", data_files=data)["train"]
    GRPOTrainer(
        model=model, reward_funcs=shorter, args=args, train_dataset=ds, processing_class=tok, peft_config=lora
    ).train()


def _reset() -> None:
    import gc

    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    gc.collect()


def driver(work: str, model_dir: str, data: str, sharded: str, gathered: str) -> None:
    import torch.distributed as dist

    from fsdp_tune.worker.recipe import run as recipe

    timings: dict[str, list] = {p: [] for p in PATHS}
    dist.init_process_group("gloo")
    _timed_generation(record := [])
    _ddp(model_dir, data, str(Path(work) / "ddp"))
    timings["ddp"], record[:] = list(record), []
    _reset()
    for name, spec in (("sharded", sharded), ("gathered", gathered)):
        recipe(spec, started=time.time())
        timings[name], record[:] = list(record), []
        _reset()
    if dist.get_rank() == 0:
        (Path(work) / "generation_timings.json").write_text(json.dumps(timings))
    dist.barrier()


if __name__ == "__main__":
    driver(*sys.argv[1:6])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as fsdp_tune/worker/__main__.py: no native teardown after the work is done
