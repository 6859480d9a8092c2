"""The GPU check's scenarios, most important first, and how each is run and judged (benchmarks/gpu_check.py).

Each scenario is one `fsdp-tune` command (two for a resume), run as a user runs it, with its own time cap. Each
one's verdict is a set of named checks printed pass/fail: the run trained and its adapter checked whole; its
measured peak memory within 15% of `fsdp-tune plan`'s (peak allocated on a GPU, peak RSS on CPU); for a pair,
the same losses; for a resume, the uninterrupted run's losses after the checkpoint. Each also states its MFU
with the formula: LoRA on a frozen base costs forward (2N) + activation gradients (2N) = 4N FLOPs a token, plus
2N when the layers are recomputed (activation checkpointing), N the base model's parameters (attention's own
FLOPs not counted), against the GPU's dense bf16 peak (989 TFLOP/s for H100/H200).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_CONFIG = REPO / "configs" / "demo_cpu.yaml"
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "4090": 165.0, "L40S": 362.0}
MEMORY_TOLERANCE = 0.15  # measured peak vs the plan
LOSS_TOLERANCE = {"cuda": 0.02, "cpu": 1e-3}  # relative, per step: GPU kernels are not bitwise deterministic
QLORA = ("--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "bfloat16", "--use_nested_quant", "True")
QLORA_BF16 = (*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True")
QLORA_FP32 = (*QLORA, "--bnb_4bit_quant_storage_dtype", "float32", "--bf16", "True")
FSDP1 = ("--bf16", "True", "--fsdp_version", "1")
OFFLOAD = ("--fsdp_offload_params", "true")
FULL_CKPT = ("--fsdp_state_dict_type", "FULL_STATE_DICT")
BNB = ("trl", "datasets", "bitsandbytes")
FLAGSHIP = "QLoRA FSDP2 + cpu_offload + sharded loading"
FSDP1_CPU = "FSDP1 is GPU only (refused on CPU)"


@dataclass(frozen=True)
class Scenario:
    name: str
    flags: tuple[str, ...] = ()
    why: str = ""
    kind: str = "train"  # train | resume (checkpoint, then resume a copy) | refuse (PF050) | paths (gpu_paths.py)
    est_s: int = 40  # expected seconds on one H200, everything included
    cap_s: int = 150  # the scenario is cut here
    model: str = "small"  # small (builtin:llama-1b) | big (builtin:llama-8b) | tiny; tiny everywhere in --cpu-smoke
    needs: tuple[str, ...] = ("trl", "datasets")
    gpu_only: str | None = None  # why it cannot run on CPU: skipped by --cpu-smoke (its flags are still decided)
    min_gpus: int = 1
    same_as: str | None = None  # must train like that scenario (same losses)
    processes: int | None = None  # None: every GPU (2 ranks in --cpu-smoke)
    cpu_run: bool = False  # --use_cpu true, on the GPU machine too


def scenarios(gpus: int) -> list[Scenario]:
    """Most important first: a run cut off by its budget keeps these."""
    half = max(gpus // 2, 1)
    mesh = ("--bf16", "True", "--use_parallelism_config", "--parallelism_config_dp_shard_size", str(half))
    return [
        Scenario(FLAGSHIP, (*QLORA_BF16, *OFFLOAD), "#21 item 1: offloaded shards on the host", est_s=45, needs=BNB),
        Scenario("LoRA FSDP2", ("--bf16", "True"), "MFU", est_s=35, cap_s=120),
        Scenario(
            "LoRA FSDP2 + cpu_offload: FULL_STATE_DICT checkpoint then resume",
            ("--bf16", "True", *OFFLOAD, *FULL_CKPT),
            "#21 item 3b: resume copies each rank's rows into offloaded shards",
            kind="resume",
            est_s=75,
            cap_s=240,
        ),
        Scenario(
            "LoRA FSDP1 on one GPU (NO_SHARD)",
            FSDP1,
            "#21 item 3a: the final save unit by unit",
            est_s=35,
            cap_s=120,
            gpu_only=FSDP1_CPU,
            processes=1,
        ),
        Scenario(
            "one-process CPU run on this GPU machine",
            (),
            "#21 item 2: a CPU mesh on a CUDA build",
            est_s=25,
            cap_s=90,
            model="tiny",
            processes=1,
            cpu_run=True,
        ),
        Scenario(
            "QLoRA FSDP2 + cpu_offload + transformers loading",
            (*QLORA_BF16, *OFFLOAD, "--loading", "transformers"),
            "sharded loading trains as from_pretrained does",
            est_s=45,
            needs=BNB,
            same_as=FLAGSHIP,
        ),
        Scenario(
            "memory pre-flight refuses a run that cannot fit",
            refuse_flags(),
            "#21 item 5: PF050, no GPU time",
            kind="refuse",
            est_s=10,
            cap_s=60,
            needs=(),
            processes=1,
        ),
        # the rest, while time is left
        Scenario("LoRA FSDP2 + cpu_offload", ("--bf16", "True", *OFFLOAD), "the cuda:nccl,cpu:gloo group", est_s=35),
        Scenario(
            "QLoRA fp32 storage under bf16", QLORA_FP32, "FSDP2's policy in the storage dtype", est_s=40, needs=BNB
        ),
        Scenario(
            "QLoRA FSDP1 + cpu_offload (the seed's)",
            (*QLORA_BF16, "--fsdp_version", "1", *OFFLOAD),
            "FSDP1 from_pretrained",
            est_s=45,
            gpu_only=FSDP1_CPU,
            needs=BNB,
            processes=1,
        ),
        Scenario(
            "LoRA FSDP1: FULL_STATE_DICT checkpoint then resume",
            (*FSDP1, *FULL_CKPT),
            "FSDP1 saves and resumes unit by unit",
            kind="resume",
            est_s=70,
            cap_s=240,
            gpu_only=FSDP1_CPU,
            processes=1,
        ),
        Scenario(
            "GPU paths underneath (benchmarks/gpu_paths.py)",
            (),
            "torch/PEFT/bitsandbytes alone",
            kind="paths",
            est_s=30,
            cap_s=120,
            needs=(),
        ),
        Scenario(
            "LoRA FSDP2 on builtin:llama-8b",
            ("--bf16", "True"),
            "MFU at 8B (the model built first)",
            est_s=150,
            cap_s=300,
            model="big",
            gpu_only="on CPU the same run as LoRA FSDP2 (the tiny model)",
        ),
        Scenario(f"HSDP 2 x {half}", (*mesh, "--parallelism_config_dp_replicate_size", "2"), min_gpus=4),
        Scenario(
            f"context parallelism 2 x {half}",
            (*mesh, "--parallelism_config_cp_size", "2", "--packing", "False"),
            min_gpus=2,
        ),
    ]


def refuse_flags() -> tuple[str, ...]:
    """A run no single GPU holds: builtin:llama-1b with 32 x 8192 tokens a step and no recompute plans ~400 GiB of
    activations. --cpu-smoke runs the same command against a simulated H200 (a stand-in nvidia-smi)."""
    tokens = ("--per_device_train_batch_size", "32", "--max_seq_len", "8192")
    return ("--bf16", "True", *tokens, "--fsdp_activation_checkpointing", "false")


@dataclass(frozen=True)
class Mode:
    """Where the check runs: one GPU machine, or --cpu-smoke (the tiny model on CPU, the same path)."""

    device: str  # cuda | cpu
    gpus: int
    gpu_name: str
    gpu_mib: int | None
    steps: int
    warmup: int
    env: dict = field(default_factory=dict)

    @property
    def peak_tflops(self) -> float | None:
        return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in self.gpu_name), None)

    def model(self, s: Scenario) -> str:
        if (self.device == "cpu" and s.kind != "refuse") or s.model == "tiny":
            return "builtin:tiny-llama"  # the refusal plans the GPU model: nothing is built
        return os.environ.get("GPU_CHECK_MODEL" if s.model == "big" else "GPU_CHECK_SMALL_MODEL") or (
            "builtin:llama-8b" if s.model == "big" else "builtin:llama-1b"
        )

    def world(self, s: Scenario) -> int:
        return s.processes or (2 if self.device == "cpu" else max(self.gpus, 1))


def args_for(s: Scenario, mode: Mode, steps: int | None = None) -> list[str]:
    """`fsdp-tune train` flags (without --output_dir) for scenario `s` on this machine."""
    on_cpu = (mode.device == "cpu" and s.kind != "refuse") or s.cpu_run
    small = on_cpu or s.model == "tiny"
    out = ["--config", str(BASE_CONFIG), "--model_name_or_path", mode.model(s)]
    out += ["--num_processes", str(mode.world(s)), "--max_steps", str(steps or mode.steps), "--logging_steps", "1"]
    out += ["--save_strategy", "no", "--fsdp_activation_checkpointing", "true", "--gradient_checkpointing", "false"]
    out += ["--lora_r", "16", "--lora_dropout", "0.0", "--packing", "True", "--use_cpu", str(on_cpu).lower()]
    out += ["--max_seq_len", "128", "--per_device_train_batch_size", "2"] if small else []
    out += [] if small else ["--max_seq_len", "2048", "--per_device_train_batch_size", "4"]
    return [*out, *s.flags]


def cli(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python -m fsdp_tune ARGS` within `timeout` (run_group)."""
    return run_group([sys.executable, "-m", "fsdp_tune", *args], env, timeout)


def run_group(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`cmd` in its own process group, ended with everything it started (TERM, then KILL) at `timeout`: exit 124."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=max(timeout, 1))
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        out = err = ""
        for sig in (signal.SIGTERM, signal.SIGKILL):  # fsdp-tune stops its ranks on TERM; KILL if it has not
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                out, err = proc.communicate(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        return subprocess.CompletedProcess(cmd, 124, out, f"{err}\ncut at the scenario's cap ({timeout:.0f} s)")


def plan(args: list[str], mode: Mode, on_cpu: bool, timeout: float) -> dict:
    """`fsdp-tune plan --json` for the same flags, on this machine's GPU (its name and memory) or its CPU."""
    from fsdp_tune.preflight.memory import gpu_key

    where = (
        ["--cpu"]
        if on_cpu
        else ["--gpu", gpu_key(mode.gpu_name)] + (["--gpu_memory", f"{mode.gpu_mib}MiB"] if mode.gpu_mib else [])
    )
    done = cli(["plan", *args, "--json", *where], mode.env, timeout)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-600:]}


def failure_text(proc: subprocess.CompletedProcess, out: Path) -> str:
    """The launcher's last words and each rank log's tail (for failures.log)."""
    parts = [f"exit {proc.returncode}", proc.stderr[-3000:], proc.stdout[-1500:]]
    for log in sorted((out / "logs").glob("rank-*.log")) if (out / "logs").is_dir() else []:
        parts.append(f"--- {log.name} (last 40 lines)\n" + "\n".join(log.read_text().splitlines()[-40:]))
    return "\n".join(parts)


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def tokens_per_s(rows: list[dict], warmup: int) -> float | None:
    timed = [m for m in rows if "loss" in m and "num_tokens" in m and "time" in m]
    if len(timed) < 2:
        return None
    first, last = timed[min(warmup, len(timed) - 2)], timed[-1]
    return (last["num_tokens"] - first["num_tokens"]) / max(last["time"] - first["time"], 1e-9)


def mfu(tps: float | None, n_params: int, recompute: bool, mode: Mode, world: int) -> tuple[float | None, str]:
    """(MFU, the formula with its numbers)."""
    factor = 6 if recompute else 4
    text = f"{factor}N FLOPs/token (4N forward + activation gradients{', +2N recompute' if recompute else ''})"
    text += f", N={n_params / 1e9:.2f}B" if n_params >= 1e8 else f", N={n_params / 1e6:.2f}M"
    peak = mode.peak_tflops if mode.device == "cuda" else None
    if not (tps and n_params and peak):
        return None, text + ("; no GPU peak here" if not peak else "")
    value = tps * factor * n_params / (peak * 1e12 * world)
    return value, f"{tps:,.0f} tok/s x {text} / ({peak:.0f} TFLOP/s x {world} GPU) = {value:.1%}"


def memory_check(summary: dict, planned: dict, on_cpu: bool) -> tuple[bool | None, str]:
    """Measured peak against the plan, within MEMORY_TOLERANCE: (pass, the line). None when there is no plan."""
    ranks = summary.get("per_rank") or []
    if on_cpu:
        measured = max((r.get("peak_rss_mib") or 0) for r in ranks) / 1024 if ranks else None
        want, what = planned.get("per_rank_host_peak_gib"), "peak RSS per rank"
    else:
        measured = max((r.get("peak_gpu_allocated_mib") or 0) for r in ranks) / 1024 if ranks else None
        want, what = planned.get("peak_allocated_gib"), "peak allocated"
    if not measured or not want:
        return None, f"memory: {what} {measured or '-'} GiB, plan {want or '-'}: not compared"
    off = measured / want - 1
    ok = abs(off) <= MEMORY_TOLERANCE
    line = f"memory: {what} {measured:.2f} GiB vs plan {want:.2f} GiB ({off:+.0%}): {'PASS' if ok else 'FAIL'}"
    return ok, line + f" (within {MEMORY_TOLERANCE:.0%}{'; not counted on CPU' if on_cpu else ''})"


def copy_checkpoint(source: Path, step: int, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source / f"checkpoint-{step}", target / f"checkpoint-{step}")
