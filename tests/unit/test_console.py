"""The console of a run, launcher side and rank side without torch: --verbose reaches the rank spec, torchrun's
OMP_NUM_THREADS banner is answered in the ranks' environment, and a rank's streams send the libraries' output
to its log while people see only what fsdp-tune writes for them."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import console_mode, decide
from fsdp_tune.validate import check
from fsdp_tune.worker.logs import Console
from tests.conftest import FIXTURES

BASE = str(FIXTURES / "tiny_lora.yaml")


def _spec(tmp_path, *flags: str) -> dict:
    r = CliRunner().invoke(
        app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), "--dry_run", "--json", *flags]
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["spec"]


def test_verbose_reaches_the_ranks_through_the_spec(tmp_path) -> None:
    assert _spec(tmp_path)["console"] == "lines"  # the test's stdout is no terminal
    assert _spec(tmp_path, "--verbose")["console"] == "verbose"
    assert console_mode(verbose=False, tty=True) == "live" and console_mode(verbose=True, tty=True) == "verbose"


def test_omp_num_threads_is_what_torchrun_would_set() -> None:
    """torchrun sets OMP_NUM_THREADS=1, with a banner, when it is unset and a machine runs several ranks; the
    spec says it instead (no banner), and leaves a value the launcher has, and one-rank machines, alone."""
    two = check(BASE, []).config
    one = check(BASE, ["--num_processes", "1"]).config
    assert decide(two, Machine.cpu_only()).env["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in decide(two, Machine(cuda=False, gpus=0, omp_num_threads="4")).env
    assert "OMP_NUM_THREADS" not in decide(one, Machine.cpu_only()).env


def test_a_live_line_is_redrawn_and_lines_go_above_it() -> None:
    out, log = io.StringIO(), io.StringIO()
    c = Console(out, out, log, live=True)
    c.status("step 1/9  loss 2.000")
    c.status("step 2/9")
    c.line("eval (step 2)  loss 1.5")
    c.end_status()
    assert out.getvalue() == (
        "\rstep 1/9  loss 2.000"
        "\rstep 2/9"
        + " " * 12  # the longer line before is wiped
        + "\r"
        + " " * 8
        + "\r"  # the live line cleared, the line printed, the live line drawn again
        + "eval (step 2)  loss 1.5\n\rstep 2/9\n"
    )
    assert log.getvalue() == "eval (step 2)  loss 1.5\n"  # the log gets lines, not redraws


def test_plain_console_ignores_redraws_and_survives_a_closed_reader() -> None:
    out = io.StringIO()
    c = Console(out, None, None, live=False)
    c.status("step 1/9")
    c.line("first step  0.4 s")
    out.close()  # the reader left (`| head`)
    c.line("still running")
    assert c.out is None


RANK = """
import os, sys
from fsdp_tune.worker.logs import console, setup_rank_log
setup_rank_log({out!r}, {rank}, {mode!r})
print("a library's print")
print("a library's warning", file=sys.stderr)
os.write(1, b"native stdout\\n")
os.write(2, b"native stderr\\n")
console().line("loading model  0.2 s")
console().line("warning: for people", err=True)
console().show_error("Traceback: a rank's error")
"""


def _rank(tmp_path, rank: int, mode: str) -> tuple[subprocess.CompletedProcess, str]:
    code = RANK.format(out=str(tmp_path), rank=rank, mode=mode)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc, (tmp_path / "logs" / f"rank-{rank}.log").read_text()


def test_a_quiet_rank_0_shows_people_lines_and_logs_everything(tmp_path) -> None:
    proc, log = _rank(tmp_path, 0, "lines")
    assert proc.stdout == "loading model  0.2 s\n"
    assert proc.stderr == "warning: for people\n"  # a rank's traceback: the log; the launcher's report: the console
    assert "Traceback: a rank's error" not in proc.stdout
    for text in ("a library's print", "a library's warning", "native stdout", "native stderr", "loading model"):
        assert text in log, text


def test_other_ranks_show_nothing_and_verbose_shows_everything(tmp_path) -> None:
    proc, log = _rank(tmp_path, 1, "lines")
    assert proc.stdout == proc.stderr == ""
    assert "native stderr" in log and "loading model" in log
    proc, log = _rank(tmp_path, 0, "verbose")
    assert "a library's print" in proc.stdout and "loading model" in proc.stdout
    assert "a library's warning" in proc.stderr
    assert "Traceback: a rank's error" not in proc.stderr  # Python prints a verbose rank's error itself
    for text in ("a library's print", "a library's warning", "native stdout", "native stderr", "loading model"):
        assert text in log, text


class _Param:
    def __init__(self, numel: int, trainable: bool) -> None:
        self._numel, self.requires_grad = numel, trainable

    def numel(self) -> int:
        return self._numel


class _Module:
    def __init__(self, params: dict, children: tuple = (), **attrs) -> None:
        self._params, self._children = params, children
        self.__dict__.update(attrs)

    def modules(self):
        yield self
        for child in self._children:
            yield from child.modules()

    def named_parameters(self, recurse: bool = False):
        return iter(self._params.items())


class Linear4bit(_Module):  # bitsandbytes' class name is what the count looks for
    pass


def test_loading_line_counts_the_checkpoints_parameters_on_either_path() -> None:
    from fsdp_tune.worker.phases import _base_class, _base_parameters

    tied = _Param(1000, trainable=False)
    packed = Linear4bit({"weight": _Param(50, trainable=False)}, in_features=20, out_features=10)  # 200 unpacked
    lora = _Module({"weight": _Param(30, trainable=True)})
    layers = (_Module({"weight": tied}), packed, lora, _Module({"weight": tied}))  # tied embedding and head
    sharded = _Module({}, layers, peft_config={})  # a PeftModel: the adapter is not the base's
    assert _base_parameters(sharded) == 1000 + 200
    before_peft = _Module({}, layers[:2])  # the transformers path: LoRA comes later, everything trainable
    assert _base_parameters(before_peft) == 1200

    class FSDPLlamaForCausalLM:  # fully_shard's rename, under PEFT's wrapper
        pass

    wrapper = type("PeftModelForCausalLM", (), {"get_base_model": lambda self: FSDPLlamaForCausalLM()})()
    assert _base_class(wrapper) == "LlamaForCausalLM"
