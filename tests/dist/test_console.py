"""README.md's quick start, run as written, and the run as people see it: each line of the quick start exits 0,
or with the code its comment names (`# exit 2: FT030`), in a fresh folder holding only what a clone has
(configs/, scripts/) and this checkout's .venv (#25 item 10: its last line reported on a run that did not
exist). Its `train` line is the CPU demo: the console holds the plan, the phases, the progress line and the
summary, and no library chatter; every rank's log holds all of it; `chat` answers from the adapter; `merge`
keeps the fp32 base fp32. (The progress line's and evaluation lines' forms, driven without processes:
tests/lib/test_console.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import REPO, offline_env

SYSTEM = "You are a concise assistant."  # the demo data's system message
EXIT = re.compile(r"#\s*exit (\d+)(?::\s*(\w+))?")
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


def _cli(*args: str, stdin: str | None = None) -> SimpleNamespace:
    """`fsdp-tune ARGS...` through the CLI in this process (CliRunner): the checks after the quick start read what
    a command answered; what a person sees of one, in a process of its own, is the quick start's own lines above
    (a process more would import torch, transformers and PEFT again: ~8 CPU-s a call)."""
    from typer.testing import CliRunner

    from fsdp_tune.cli.app import app

    said = CliRunner().invoke(app, list(args), input=stdin)
    failure = f"\n{said.exception!r}" if said.exception and not isinstance(said.exception, SystemExit) else ""
    return SimpleNamespace(returncode=said.exit_code, stdout=said.stdout, stderr=said.stderr + failure)


def quick_start() -> list[str]:
    """The commands of the first bash block under '## Quick start', comments and blank lines dropped."""
    section = (REPO / "README.md").read_text().split("\n## Quick start\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_quick_start_runs_as_written_and_the_demo_reads_well(model_cache, tmp_path: Path) -> None:
    lines = quick_start()
    for name in ("configs", "scripts"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])  # the venv running this test
    env, ran = offline_env(model_cache), {}
    for line in lines:
        want = EXIT.search(line)
        proc = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        said = proc.stdout + proc.stderr
        assert proc.returncode == (int(want.group(1)) if want else 0), f"{line}\n{said[-4000:]}"
        if want and want.group(2):
            assert want.group(2) in said, f"{line}: {want.group(2)} not said\n{said[-2000:]}"
        ran[line] = proc
    run_dir = tmp_path / "runs" / "demo"
    assert (tmp_path / "runs" / "demo-merged" / "config.json").is_file()
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    (demo,) = [proc for line, proc in ran.items() if " train --config configs/demo_cpu.yaml" in line]
    _the_console_is_a_screenful(demo, run_dir)
    _chat_answers_from_the_adapter(run_dir)
    (merged,) = [proc for line, proc in ran.items() if " merge --adapter runs/demo -o runs/demo-merged" in line]
    _merge_keeps_the_base_dtype(run_dir, tmp_path, merged)


def _the_console_is_a_screenful(proc: subprocess.CompletedProcess, run_dir: Path) -> None:
    out, err = proc.stdout, proc.stderr
    assert err == "", err  # nothing from torchrun, the ranks or the libraries
    for chatter in CHATTER:
        assert chatter not in out, f"{chatter!r} on the console:\n{out}"
    lines = out.splitlines()
    # the plan, the phases and the summary: a screenful, however long the run took (progress lines come one per
    # LINES_EVERY_S, so their number follows the machine's speed and is not counted here)
    others = [line for line in lines if not line.startswith("step ")]
    assert lines[0].startswith("plan: 2 ranks") and len(others) < 30, out
    said = {line.split("  ")[0].rstrip(): line for line in lines if not line.startswith(" ")}
    assert "LlamaForCausalLM" in said["loading model"] and " s  " in said["loading model"]
    assert "640 train rows" in said["preparing data"]
    assert "7 FSDP units on 2 ranks" in said["sharding"]
    assert "after the rank started" in said["first step"]
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[-1].startswith("step 120/120  loss ") and "tokens/s" in progress[-1] and "MiB RSS" in progress[-1]
    assert any("ETA" in line for line in progress[:-1]), progress
    assert "56 LoRA tensors" in said["saving"]
    assert "done: 120 steps" in out

    logs = run_dir / "logs"
    rank0, rank1 = (logs / "rank-0.log").read_text(), (logs / "rank-1.log").read_text()
    for text in ("{'loss'", "it/s]", "examples/s]", "Warning", "rank 0/2 starting", "step 120/120"):
        assert text in rank0, text  # nothing lost
    assert "Warning" in rank1 and "rank 1/2 starting" in rank1 and "step 120/120" not in rank1


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


def _merge_keeps_the_base_dtype(run_dir, tmp_path, r: subprocess.CompletedProcess) -> None:
    """`r`: the quick start's merge without --dtype (into runs/demo-merged)."""
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    base_dir = json.loads((run_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert "--dtype" not in r.args[-1] and r.returncode == 0, r.stderr[-3000:]
    assert "in float32 (the base's own, from config.json)" in r.stdout, r.stdout
    assert "Warning" not in r.stderr and "kernels" not in r.stderr, r.stderr  # the result lines, no chatter
    m32 = tmp_path / "runs" / "demo-merged"
    r = _cli("merge", "--adapter", str(run_dir), "-o", str(tmp_path / "m16"), "--dtype", "bf16")
    assert r.returncode == 0 and "in bfloat16 (as --dtype asked)" in r.stdout, r.stdout + r.stderr[-3000:]
    for folder, dtype in ((m32, torch.float32), (tmp_path / "m16", torch.bfloat16)):
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {dtype}, folder

    ids = torch.tensor([list(range(5, 45))])
    with torch.no_grad():
        want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(run_dir))(ids).logits
        got = AutoModelForCausalLM.from_pretrained(m32)(ids).logits
    assert got.dtype == torch.float32
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-4
