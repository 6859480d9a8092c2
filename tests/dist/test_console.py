"""The run as people see it, and what they do after it, on the CPU demo (one training launch): the console
holds the plan, the phases, the progress line, evaluation results and the summary, and no library chatter;
every rank's log holds all of it; `chat` answers from the adapter; `merge` keeps the fp32 base fp32.
The progress line's two forms (a terminal, a file) are driven without processes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.dist
DEMO = REPO / "configs" / "demo_cpu.yaml"
SYSTEM = "You are a concise assistant."  # the demo data's system message
# what the libraries print on the way (each seen on the demo's console before): none of it on the console
CHATTER = (
    "Setting OMP_NUM_THREADS",
    "*****",
    "kernels-community",
    "Warning",
    "warnings.warn",
    "Loading weights",
    "Generating",
    "Tokenizing",
    "examples/s]",
    "it/s]",
    "{'loss'",
    "{'train_runtime'",
)


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fsdp_tune", *args], input=stdin, capture_output=True, text=True, timeout=300
    )


def test_demo_console_logs_chat_and_merge(train, tmp_path) -> None:
    run = train("--eval_strategy", "steps", "--eval_steps", "60", config=DEMO, output_dir=tmp_path / "demo")
    out, err = run.proc.stdout, run.proc.stderr
    assert err == "", err  # nothing from torchrun, the ranks or the libraries
    for chatter in CHATTER:
        assert chatter not in out, f"{chatter!r} on the console:\n{out}"
    lines = out.splitlines()
    assert lines[0].startswith("plan: 2 ranks") and len(lines) < 35, out
    said = {line.split("  ")[0].rstrip(): line for line in lines if not line.startswith(" ")}
    assert "LlamaForCausalLM" in said["loading model"] and " s  " in said["loading model"]
    assert "640 train rows" in said["preparing data"] and "tokens; 64 eval rows" in said["preparing data"]
    assert "7 FSDP units on 2 ranks" in said["sharding"]
    assert "after the rank started" in said["first step"]
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[-1].startswith("step 120/120  loss ") and "tokens/s" in progress[-1] and "MiB RSS" in progress[-1]
    assert any("ETA" in line for line in progress[:-1]), progress
    assert "loss" in said["eval (step 60)"] and "loss" in said["eval (step 120)"]
    assert "56 LoRA tensors" in said["saving"]
    assert "done: 120 steps" in out

    logs = run.output_dir / "logs"
    rank0, rank1 = (logs / "rank-0.log").read_text(), (logs / "rank-1.log").read_text()
    for text in ("{'loss'", "it/s]", "examples/s]", "Warning", "rank 0/2 starting", "step 120/120"):
        assert text in rank0, text  # nothing lost
    assert "Warning" in rank1 and "rank 1/2 starting" in rank1 and "step 120/120" not in rank1

    _chat_answers_from_the_adapter(run.output_dir)
    _merge_keeps_the_base_dtype(run.output_dir, tmp_path)


def _chat_answers_from_the_adapter(run_dir) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt = "Count from 1 to 8."
    r = _cli("chat", str(run_dir), "--system", SYSTEM, "--prompt", prompt, "--max_new_tokens", "24", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(float32) + adapter" in r.stderr and "its chat template, on cpu" in r.stderr
    answer = r.stdout.strip()
    assert answer and "<|im" not in answer, r.stdout  # words, not the end of the turn or special tokens

    # the same greedy reply, generated here from base + adapter with the run's tokenizer; the base alone differs
    tok = AutoTokenizer.from_pretrained(run_dir)
    base_dir = json.loads((run_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(run_dir)).eval()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    ids = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), return_tensors="pt")
    with torch.no_grad():
        mine = model.generate(**ids, max_new_tokens=24, do_sample=False, eos_token_id=tok.eos_token_id)
        with model.disable_adapter():
            bare = model.generate(**ids, max_new_tokens=24, do_sample=False, eos_token_id=tok.eos_token_id)
    n = ids["input_ids"].shape[1]
    assert tok.decode(mine[0, n:], skip_special_tokens=True).strip() == answer
    assert tok.decode(bare[0, n:], skip_special_tokens=True).strip() != answer

    # interactive: the same answer to the same first message; an empty line ends
    r = _cli("chat", str(run_dir), "--system", SYSTEM, "--max_new_tokens", "24", stdin=f"{prompt}\n\n")
    assert r.returncode == 0 and answer in r.stdout, r.stdout + r.stderr[-2000:]


def _merge_keeps_the_base_dtype(run_dir, tmp_path) -> None:
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    base_dir = json.loads((run_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    r = _cli("merge", "--adapter", str(run_dir), "-o", str(tmp_path / "m32"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "in float32 (the base's own, from config.json)" in r.stdout, r.stdout
    assert "Warning" not in r.stderr and "kernels" not in r.stderr, r.stderr  # the result lines, no chatter
    r = _cli("merge", "--adapter", str(run_dir), "-o", str(tmp_path / "m16"), "--dtype", "bf16")
    assert r.returncode == 0 and "in bfloat16 (as --dtype asked)" in r.stdout, r.stdout + r.stderr[-3000:]
    for folder, dtype in (("m32", torch.float32), ("m16", torch.bfloat16)):
        with safe_open(str(tmp_path / folder / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {dtype}, folder

    ids = torch.tensor([list(range(5, 45))])
    with torch.no_grad():
        want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(run_dir))(ids).logits
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "m32")(ids).logits
    assert got.dtype == torch.float32
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-4


def _state(step: int, total: int = 10) -> SimpleNamespace:
    return SimpleNamespace(is_world_process_zero=True, global_step=step, max_steps=total)


def _drive(live: bool, monkeypatch) -> str:
    """Ten steps with a log at every other one, through ProgressCallback, onto a console in memory."""
    from fsdp_tune.worker import logs
    from fsdp_tune.worker.phases import Phases
    from fsdp_tune.worker.training import progress
    from fsdp_tune.worker.training.methods import METHODS

    out = io.StringIO()
    monkeypatch.setattr(logs, "_console", logs.Console(out, out, None, live=live))
    clock = iter(range(1000))
    monkeypatch.setattr(progress.time, "time", lambda: float(next(clock)) * 3)  # 3 s per call
    cb = progress.ProgressCallback("cpu", 2, Phases(0.0), live, METHODS["sft"].metrics)
    cb.on_train_begin(None, _state(0), None)
    for step in range(1, 11):
        cb.on_step_end(None, _state(step), None)
        if step % 2 == 0:
            logs_ = {"loss": 5.0 - step / 10, "learning_rate": 1e-3, "num_tokens": 1000.0 * step}
            cb.on_log(None, _state(step), None, logs=logs_)
    cb.on_evaluate(None, _state(10), None, metrics={"eval_loss": 4.2, "eval_runtime": 0.5})
    cb.on_train_end(None, _state(10), None)
    return out.getvalue()


def test_progress_is_redrawn_on_a_terminal_and_plain_lines_elsewhere(monkeypatch) -> None:
    plain = _drive(False, monkeypatch)
    assert "\r" not in plain
    steps = [line for line in plain.splitlines() if line.startswith("step ")]
    # at most one line per LINES_EVERY_S (10 s; the fake clock moves 3 s a call), and the last step's
    assert [s.split()[1] for s in steps] == ["2/10", "6/10", "10/10"], plain
    assert steps[0].startswith("step 2/10  loss 4.800  lr 1.0e-03  ") and "tokens/s  ETA " in steps[0]
    assert "ETA" not in steps[-1] and "MiB RSS" in steps[-1]
    assert "eval (step 10)" in plain and "loss 4.2000" in plain

    live = _drive(True, monkeypatch)
    assert live.count("\rstep ") >= 5 and live.endswith("\n")
    assert "\rstep 10/10  loss 4.000" in live


def test_the_base_dtype_comes_from_config_else_its_weights(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    from fsdp_tune.tools.merge import own_dtype

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))  # no dtype recorded
    save_file(
        {"a": torch.zeros(2, dtype=torch.bfloat16), "b": torch.zeros(2, dtype=torch.bfloat16)},
        tmp_path / "m.safetensors",
    )
    assert own_dtype(str(tmp_path)) == ("bfloat16", "the base's own, from its safetensors weights")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float16"}))
    assert own_dtype(str(tmp_path)) == ("float16", "the base's own, from config.json")
