"""The combination sweep: settings users combine, each either refused up front with a rule id or trained.

`python -m benchmarks sweep` runs every row (short CPU trainings: 2 ranks, a tiny Llama, 3 steps) and prints
the matrix with each row's outcome; `python -m benchmarks sweep --ci` runs the rows marked for CI (the bounded
form tests/dist/test_sweep.py runs). An accepted combination that crashes after launch is a bug: the row's
outcome says "CRASH" with the root cause, and the fix is a change in fsdp-tune or a rule that refuses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.timing import offline_env

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "tests" / "fixtures" / "tiny_lora.yaml"
QLORA = ["--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "float32"]
FP32_STORAGE = ["--bnb_4bit_quant_storage_dtype", "float32"]
SAVES = ["--save_strategy", "steps", "--save_steps", "2", "--max_steps", "4"]


@dataclass(frozen=True)
class Row:
    name: str
    flags: list[str]
    ci: bool = False  # in the bounded form CI runs (every refused row is: refusing costs milliseconds)
    resume: bool = False  # run to step 4 saving every 2 steps, then resume the step-2 checkpoint to 4
    expect_refused: tuple[str, ...] = ()  # rule ids that must refuse it (empty: it must train)


@dataclass
class Outcome:
    row: str
    status: str  # "trained" | "refused" | "CRASH" | "WRONG" (refused when it should train, or the reverse)
    detail: str = ""
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


# quantization x precision x storage, DoRA, wrap policies, reshard, activation vs gradient checkpointing,
# reentrant, state dict types x save/resume, eval, packing, loading, the device mesh
ROWS = [
    Row("LoRA fp32", []),
    Row("LoRA bf16", ["--bf16", "True"]),
    Row("LoRA fp16 (AMP)", ["--fp16", "True"]),
    Row("QLoRA fp32 storage, no mixed precision", [*QLORA, "--bnb_4bit_quant_storage_dtype", "float32"]),
    Row("QLoRA bf16 storage, bf16", [*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True"]),
    Row(  # CI runs it in tests/dist/test_gpu_check_smoke.py (the GPU check's CPU smoke run)
        "QLoRA fp32 storage, bf16 (FSDP2 must not cast the packed weights)",
        [*QLORA, "--bnb_4bit_quant_storage_dtype", "float32", "--bf16", "True"],
    ),
    Row("QLoRA bf16 storage, fp16", [*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--fp16", "True"]),
    Row(
        "QLoRA nested, fp32 storage",
        [*QLORA, "--use_nested_quant", "True", "--bnb_4bit_quant_storage_dtype", "float32"],
    ),
    Row("QLoRA uint8 storage", [*QLORA, "--bnb_4bit_quant_storage_dtype", "uint8"], expect_refused=("FT052",)),
    Row("DoRA", ["--use_dora", "True"]),
    Row(
        "QDoRA (mixed adapter dtypes: refused)",
        [*QLORA, "--use_dora", "True", "--bnb_4bit_quant_storage_dtype", "float32"],
        expect_refused=("FT068",),
    ),
    Row(
        "SIZE_BASED_WRAP under FSDP2",
        ["--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP", "--fsdp_min_num_params", "20000"],
        expect_refused=("FT034",),
    ),
    Row("NO_WRAP (one unit; warned)", ["--fsdp_auto_wrap_policy", "NO_WRAP"]),
    Row("reshard_after_forward false", ["--fsdp_reshard_after_forward", "false"]),
    Row("FSDP activation checkpointing", ["--fsdp_activation_checkpointing", "true"]),
    Row("gradient checkpointing, non-reentrant", ["--gradient_checkpointing", "true", "--use_reentrant", "false"]),
    Row("gradient checkpointing, reentrant", ["--gradient_checkpointing", "true", "--use_reentrant", "true"], ci=True),
    Row(
        "both checkpointings",
        ["--gradient_checkpointing", "true", "--fsdp_activation_checkpointing", "true"],
        expect_refused=("FT030",),
    ),
    Row("SHARDED_STATE_DICT save + resume", ["--fsdp_state_dict_type", "SHARDED_STATE_DICT", *SAVES], resume=True),
    Row("FULL_STATE_DICT save + resume", ["--fsdp_state_dict_type", "FULL_STATE_DICT", *SAVES], resume=True),
    Row(
        "QLoRA + FULL_STATE_DICT save + resume",
        [*QLORA, "--bnb_4bit_quant_storage_dtype", "float32", "--fsdp_state_dict_type", "FULL_STATE_DICT", *SAVES],
        resume=True,
    ),
    Row(  # CI trains eval + packing in tests/dist/test_data_train.py (the mixture of every format, packed)
        "eval + packing",
        ["--splits", "train,test", "--eval_strategy", "steps", "--eval_steps", "2", "--packing", "True"],
    ),
    Row("cpu_ram_efficient_loading", ["--fsdp_cpu_ram_efficient_loading", "true"]),
    Row(
        "HSDP 2 x 2 on 4 ranks",
        [
            *("--num_processes", "4", "--use_parallelism_config"),
            *("--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size", "2"),
        ],
    ),
    Row(
        "context parallelism on CPU",
        [
            *("--use_parallelism_config", "--parallelism_config_cp_size", "2", "--parallelism_config_dp_shard_size"),
            "1",
        ],
    ),  # trained since worker/cpu_cp.py (#51): was refused FT049; tests/dist/test_train_variants.py checks it
]


def _env(cache: Path) -> dict[str, str]:
    return offline_env(FSDP_TUNE_CACHE=str(cache), HF_DATASETS_CACHE=str(cache / "datasets"))


def _cli(args: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fsdp_tune", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO
    )


def _refused(row: Row, env: dict[str, str]) -> list[str]:
    """Rule ids validate-config refuses the row with (errors only)."""
    out = _cli(["validate-config", str(BASE), *row.flags, "--json"], env, timeout=120)
    return sorted({f["rule"] for f in json.loads(out.stdout)["findings"] if f["severity"] == "error"})


def _root_cause(proc: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in proc.stderr.splitlines() if "root cause:" in line or line.startswith("error:")]
    if lines:
        return " | ".join(lines[-2:])
    tail = proc.stderr.strip().splitlines()
    return tail[-1] if tail else f"exit {proc.returncode}"


def run_row(row: Row, work: Path, env: dict[str, str]) -> Outcome:
    started = time.time()
    refused = _refused(row, env)
    if refused:
        ok = set(refused) == set(row.expect_refused)
        return Outcome(row.name, "refused" if ok else "WRONG", ",".join(refused), seconds=time.time() - started)
    if row.expect_refused:
        return Outcome(row.name, "WRONG", f"accepted; expected {row.expect_refused}", seconds=time.time() - started)
    out = work / row.name.replace(" ", "_").replace("/", "_")[:60]
    steps = [] if row.resume else ["--max_steps", "3"]
    proc = _cli(["train", "--config", str(BASE), *row.flags, *steps, "--output_dir", str(out)], env)
    if proc.returncode == 0 and row.resume:
        # resume the step-2 checkpoint (the step-4 one removed) and train to step 4 again
        for ckpt in out.glob("checkpoint-4"):
            subprocess.run(["rm", "-rf", str(ckpt)], check=True)
        flags = [*row.flags, "--resume_from_checkpoint", "latest"]
        proc = _cli(["train", "--config", str(BASE), *flags, "--output_dir", str(out)], env)
    if proc.returncode != 0:
        return Outcome(row.name, "CRASH", _root_cause(proc), seconds=time.time() - started)
    summary = json.loads((out / "fsdp_tune_summary.json").read_text())
    losses = summary.get("losses", [])
    finite = all(x == x and abs(x) != float("inf") for x in losses)
    status = "trained" if finite and summary.get("adapter_check", {}).get("ok") else "CRASH"
    return Outcome(
        row.name, status, "" if status == "trained" else "adapter check failed", losses, time.time() - started
    )


def run(ci: bool = False, only: str | None = None) -> list[Outcome]:
    rows = [r for r in ROWS if (r.ci or r.expect_refused or not ci) and (only is None or only in r.name)]
    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-sweep-"))
    env = _env(Path(os.environ.get("FSDP_TUNE_CACHE", "~/.cache/fsdp-tune")).expanduser())
    outcomes = []
    for row in rows:
        outcome = run_row(row, work, env)
        print(f"  {outcome.status:<8} {row.name:<62} {outcome.seconds:5.0f} s  {outcome.detail}", flush=True)
        outcomes.append(outcome)
    return outcomes


def as_markdown(outcomes: list[Outcome]) -> str:
    lines = ["| combination | outcome | detail |", "|---|---|---|"]
    lines += [f"| {o.row} | {o.status} | {o.detail or '-'} |" for o in outcomes]
    return "\n".join(lines)
