"""The GPU check's scenarios in the order they run, and the flags of each (benchmarks/gpu_check.py).

Ordered by what a GPU minute answers: the library paths underneath (benchmarks/gpu_paths.py, seconds of GPU), the
seed's flagship path (QLoRA FSDP2 + cpu_offload, sharded loading), the 8B throughput run, then the other paths the
launcher decides, each once; last the CPU run, the memory refusal and the duplicate offload run, which answer
least. Each scenario is one `fsdp-tune train` command (two for a resume) run as a user runs it; its checks are
benchmarks/gpu_criteria.py's, its estimate benchmarks/gpu_budget.py's.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_CONFIG = REPO / "configs" / "demo_cpu.yaml"
QLORA = ("--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "bfloat16", "--use_nested_quant", "True")
QLORA_BF16 = (*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True")
QLORA_FP32 = (*QLORA, "--bnb_4bit_quant_storage_dtype", "float32", "--bf16", "True")
FSDP1 = ("--bf16", "True", "--fsdp_version", "1")
OFFLOAD = ("--fsdp_offload_params", "true")
FULL_CKPT = ("--fsdp_state_dict_type", "FULL_STATE_DICT")
NO_RECOMPUTE = ("--fsdp_activation_checkpointing", "false")
BNB = ("trl", "datasets", "bitsandbytes")
PATHS = "GPU paths underneath (benchmarks/gpu_paths.py)"
FLAGSHIP = "QLoRA FSDP2 + cpu_offload + sharded loading"
THROUGHPUT = "LoRA FSDP2 throughput on builtin:llama3-8b (NeMo's shape)"
RESUME = "LoRA FSDP2 + cpu_offload: FULL_STATE_DICT checkpoint then resume"
GPU_TINY = "tiny LoRA in fp32 on the GPU (the CPU run is its reference)"
CPU_RUN = "one-process CPU run on this GPU machine"
GRPO = "GRPO QLoRA bf16, one rank (generation, the rewards, the adapter-disabled reference)"
VISION = "vision LoRA on a tiny Qwen2-VL, one rank (images, mm_token_type_ids, M-RoPE)"
# GRPO on the flagship's 1B in 4-bit: 4 completions of 16 tokens a prompt, the built-in length reward, beta > 0 (the
# reference is the base with the adapter disabled); packing is SFT's
GRPO_FLAGS = ("--method", "grpo", "--num_generations", "4", "--per_device_train_batch_size", "4", "--packing", "False")
GRPO_FLAGS += ("--max_completion_length", "16", "--max_seq_len", "128")
GRPO_FLAGS += ("--beta", "0.01", "--learning_rate", "0.02")
VISION_FAMILY = "qwen2_vl"  # its forward refuses a batch without mm_token_type_ids (Qwen2.5-VL trains wrong)
FSDP1_CPU = "FSDP1 is GPU only (refused on CPU)"
# the throughput run: NeMo AutoModel's shape (gpu_measures.NEMO_LLAMA3_8B_LORA), 5 warm-up steps as theirs, 20 timed
THROUGHPUT_SHAPE = {"seq": 4096, "micro_batch": 2, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.1}
THROUGHPUT_STEPS = {"cuda": (25, 5), "cpu": (6, 2)}  # (steps, warm-up)


@dataclass(frozen=True)
class Scenario:
    name: str
    flags: tuple[str, ...] = ()
    why: str = ""
    kind: str = "train"  # train | resume (checkpoint, then resume a copy) | refuse (PF050) | paths | throughput
    model: str = "small"  # small (builtin:llama-1b) | big (builtin:llama3-8b) | tiny; tiny everywhere in --cpu-smoke
    needs: tuple[str, ...] = ("trl", "datasets")
    gpu_only: str | None = None  # why it cannot run on CPU: skipped by --cpu-smoke (its flags are still decided)
    min_gpus: int = 1
    same_as: str | None = None  # a pair: trains like that scenario on another loading path (same losses)
    reference: str | None = None  # the same run on the other device: same losses within REFERENCE_TOLERANCE
    loading: str | None = None  # the loading path the scenario is for (the rank must take it)
    processes: int | None = None  # None: every GPU (2 ranks in --cpu-smoke)
    cpu_run: bool = False  # --use_cpu true, on the GPU machine too
    like: str | None = None  # a GPU-only scenario's estimate comes from this one's rehearsal
    data: str | None = None  # "prompts" (GRPO) | "images" (vision): a dataset the check writes (no torch, no PIL)
    if_refused: tuple[str, ...] = ()  # flags added when the memory pre-flight refuses it on this machine
    matters: bool = True  # counted in "everything that matters" (gpu_budget.py: inside the budget)

    @property
    def launches(self) -> int:
        return 2 if self.kind == "resume" else 0 if self.kind == "refuse" else 1

    @property
    def asks_offload(self) -> bool:
        return "--fsdp_offload_params" in self.flags


def scenarios(gpus: int) -> list[Scenario]:
    half = max(gpus // 2, 1)
    mesh = ("--bf16", "True", "--use_parallelism_config", "--parallelism_config_dp_shard_size", str(half))
    nemo = THROUGHPUT_SHAPE
    lora = ("--lora_alpha", str(nemo["lora_alpha"]), "--lora_dropout", str(nemo["lora_dropout"]))
    return [
        Scenario(PATHS, why="torch/PEFT/bitsandbytes alone: NCCL + gloo, offloaded gather, 4-bit", kind="paths"),
        Scenario(FLAGSHIP, (*QLORA_BF16, *OFFLOAD), "the seed's path", loading="sharded", needs=BNB),
        # the paths transformers 5.17 (the image's) could break without a word: minutes answer them, so early
        Scenario(
            GRPO, (*GRPO_FLAGS, *QLORA_BF16), "GRPO's generation and loss", needs=BNB, processes=1, data="prompts"
        ),
        Scenario(
            VISION,
            ("--bf16", "True", "--packing", "False"),
            "images and M-RoPE on the image's transformers",
            model="vlm",
            processes=1,
            data="images",
        ),
        Scenario(
            THROUGHPUT,
            ("--bf16", "True", *lora, *NO_RECOMPUTE),
            "MFU at 4N against NeMo AutoModel's Llama-3-8B LoRA figure",
            kind="throughput",
            model="big",
            if_refused=("--fsdp_activation_checkpointing", "true"),
        ),
        Scenario(
            "QLoRA FSDP2 + cpu_offload + transformers loading",
            (*QLORA_BF16, *OFFLOAD, "--loading", "transformers"),
            "sharded loading trains as from_pretrained does",
            loading="transformers",
            needs=BNB,
            same_as=FLAGSHIP,
        ),
        Scenario(
            RESUME, ("--bf16", "True", *OFFLOAD, *FULL_CKPT), "each rank's rows back into host shards", kind="resume"
        ),
        Scenario("QLoRA fp32 storage under bf16", QLORA_FP32, "FSDP2's policy in the storage dtype", needs=BNB),
        Scenario(
            "QLoRA FSDP1 + cpu_offload (the seed's, fsdp_version 1)",
            (*QLORA_BF16, "--fsdp_version", "1", *OFFLOAD),
            "FSDP1 from_pretrained, offloaded",
            gpu_only=FSDP1_CPU,
            needs=BNB,
            processes=1,
            like="QLoRA FSDP2 + cpu_offload + transformers loading",
        ),
        Scenario(
            "LoRA FSDP1 NO_SHARD: FULL_STATE_DICT checkpoint unit by unit, then resume",
            (*FSDP1, *FULL_CKPT),
            "FSDP1 saves (final and checkpoints) and resumes unit by unit",
            kind="resume",
            gpu_only=FSDP1_CPU,
            processes=1,
            like=RESUME,
        ),
        Scenario(GPU_TINY, (), "the GPU's numbers against the CPU's", model="tiny", processes=1, reference=CPU_RUN),
        Scenario(CPU_RUN, (), "a CPU run leaves the GPU alone", model="tiny", processes=1, cpu_run=True),
        Scenario("memory pre-flight refuses a run that cannot fit", refuse_flags(), "PF050", kind="refuse", needs=()),
        Scenario(
            "LoRA FSDP2 + cpu_offload, no checkpoints (the resume's straight run again)",
            ("--bf16", "True", *OFFLOAD),
            "the offload path alone",
            matters=False,
        ),
        Scenario("LoRA FSDP2 on builtin:llama-1b", ("--bf16", "True"), "MFU at 1B", matters=False),
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
    return ("--bf16", "True", "--per_device_train_batch_size", "32", "--max_seq_len", "8192", *NO_RECOMPUTE)


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

    def model(self, s: Scenario) -> str:
        if s.model == "vlm":  # built by the check before the decisions (gpu_check.py main), on every device
            return str(check_folder() / f"tiny-{VISION_FAMILY}")
        if (self.device == "cpu" and s.kind != "refuse") or s.model == "tiny":
            return "builtin:tiny-llama"  # the refusal plans the GPU model: nothing is built
        return os.environ.get("GPU_CHECK_MODEL" if s.model == "big" else "GPU_CHECK_SMALL_MODEL") or (
            "builtin:llama3-8b" if s.model == "big" else "builtin:llama-1b"
        )

    def world(self, s: Scenario) -> int:
        return s.processes or (2 if self.device == "cpu" else max(self.gpus, 1))

    def steps_of(self, s: Scenario) -> tuple[int, int]:
        """(steps, warm-up) of scenario s: the throughput run's own, else the check's."""
        return THROUGHPUT_STEPS[self.device] if s.kind == "throughput" else (self.steps, self.warmup)


def args_for(s: Scenario, mode: Mode, steps: int | None = None) -> list[str]:
    """`fsdp-tune train` flags (without --output_dir) for scenario `s` on this machine: the scenario's own flags,
    and the check's defaults for what they leave out."""
    on_cpu = (mode.device == "cpu" and s.kind != "refuse") or s.cpu_run
    tiny = on_cpu or s.model == "tiny"
    size = {"tiny": ("128", "2"), "small": ("2048", "4"), "big": (str(THROUGHPUT_SHAPE["seq"]), "2")}
    seq, batch = size["tiny" if tiny or s.model == "vlm" else s.model]
    defaults = {
        "--model_name_or_path": mode.model(s),
        "--num_processes": str(mode.world(s)),
        "--max_steps": str(steps or mode.steps_of(s)[0]),
        "--logging_steps": "1",
        "--save_strategy": "no",
        "--fsdp_activation_checkpointing": "true",
        "--gradient_checkpointing": "false",
        "--lora_r": "16",
        "--lora_dropout": "0.0",
        "--packing": "True",
        "--use_cpu": str(on_cpu).lower(),
        "--max_seq_len": seq,
        "--per_device_train_batch_size": batch,
    }
    if s.kind == "throughput":  # full rows of text, as NeMo's mock rows are full
        defaults.update({"--dataset_name": str(throughput_data()), "--splits": "train"})
    if s.data:
        written = prompts_data() if s.data == "prompts" else image_data()
        defaults.update({"--dataset_name": str(written), "--splits": "train", "--chat_template_format": "none"})
    if s.data == "prompts":
        defaults["--reward_funcs"] = f"{reward_file()}:fewer_chars"
    out = ["--config", str(BASE_CONFIG)]
    for key, value in defaults.items():
        if key not in s.flags:
            out += [key, value]
    return [*out, *s.flags]


def with_flags(args: list[str], extra: tuple[str, ...] | list[str]) -> list[str]:
    """`args` with `extra` ("--key value" pairs) in place of the same keys' values, the others appended."""
    out, extra = list(args), list(extra)
    for key, value in zip(extra[::2], extra[1::2], strict=True):
        if key in out:
            out[out.index(key) + 1] = value
        else:
            out += [key, value]
    return out


def throughput_data(rows: int = 64, words: int = 6000) -> Path:
    """A text dataset whose every row is longer than the throughput run's sequence (cut there: full rows), made
    once per machine from a fixed seed (the shipped chat data is a few thousand tokens in all)."""
    path = Path(tempfile.gettempdir()) / "fsdp-tune-gpu-check" / f"throughput-{rows}x{words}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        vocab = "the of and to in is was for on that with as by at from his an were are which this be".split()
        text = [" ".join(rng.choice(vocab) for _ in range(words)) for _ in range(rows)]
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text("".join(json.dumps({"text": t}) + "\n" for t in text))
        tmp.replace(path)
    return path


def check_folder() -> Path:
    return Path(tempfile.gettempdir()) / "fsdp-tune-gpu-check"


def _write_once(path: Path, rows: list[dict]) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(path)
    return path


def prompts_data(rows: int = 32) -> Path:
    """GRPO's prompt rows (the length reward needs no answer column)."""
    words = "cats dogs suns trees rivers houses cars moons".split()
    return _write_once(
        check_folder() / f"grpo-prompts-{rows}.jsonl",
        [{"prompt": f"Tell me about {words[i % 8]}."} for i in range(rows)],
    )


REWARD = """def fewer_chars(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [-len(t) / 100 for t in texts]
"""


def reward_file() -> Path:
    """GRPO's reward: fewer characters score higher. A random model's completions run to max_completion_length in
    tokens (the built-in length reward gives them all 0: no advantage, no gradient), but differ in characters."""
    path = check_folder() / "gpu_check_rewards.py"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(REWARD)
    return path


def image_data(rows: int = 16) -> Path:
    """Rows with an image each (solid-colour PNGs of two sizes, written without PIL) and, every fourth, text only:
    the model's processor turns each image into a grid of tokens that M-RoPE places."""
    folder = check_folder() / f"images-{rows}"
    colors = {"red": (220, 30, 30), "green": (30, 190, 40), "blue": (30, 40, 220)}
    out = []
    for i in range(rows):
        if i % 4 == 3:
            text = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there."}]
            out.append({"messages": text, "images": []})
            continue
        name, rgb = list(colors.items())[i % 3]
        path = folder / "img" / f"{i}.png"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(solid_png(*((56, 56) if i % 2 else (84, 56)), rgb))
        question = [{"type": "image"}, {"type": "text", "text": "What color is this?"}]
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": f"It is {name}."}]
        out.append({"messages": messages, "images": [f"img/{i}.png"]})
    return _write_once(folder / "train.jsonl", out)


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG (the format's own chunks: no PIL needed to write the check's data)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def build_vlm(python: str, env: dict | None = None, timeout: float = 300.0) -> tuple[bool, str]:
    """The vision scenario's tiny Qwen2.5-VL (fsdp_tune/models/tiny_vlm.py), once per machine: (ok, what happened)."""
    import subprocess

    folder = check_folder() / f"tiny-{VISION_FAMILY}"
    if (folder / "config.json").exists():
        return True, f"{folder}: built before"
    folder.parent.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "fsdp_tune.models.tiny_vlm", VISION_FAMILY, str(folder)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    return proc.returncode == 0, f"{folder}: " + ("built" if proc.returncode == 0 else proc.stderr[-800:])
