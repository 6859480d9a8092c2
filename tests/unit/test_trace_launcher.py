"""`plan --trace` on the launcher side, without torch: the refusals (TR001 a library the trace was not checked
against, TR002 a setting it does not build), the lines it prints beside the plan, and the promise that nothing
outside the trace package imports it except lazily, when --trace is given."""

from __future__ import annotations

import ast
from importlib import metadata

import pytest

from fsdp_tune.errors import ExitCode, PreflightError
from fsdp_tune.output.trace import compare, format_trace
from fsdp_tune.trace import guard
from fsdp_tune.validate import check
from tests.conftest import REPO

FSDP2 = str(REPO / "configs" / "fsdp2.json")
LORA = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--use_peft_lora", "True", "--bf16", "True"]


def test_a_torch_it_was_not_checked_against_is_refused_before_torch_is_imported(monkeypatch) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda dist: "2.14.0" if dist == "torch" else real(dist))
    with pytest.raises(PreflightError) as err:
        guard.check_versions(quantized=False)
    finding = err.value.findings[0]
    assert finding.rule == "TR001" and finding.source == "torch 2.14.0" and "2.13" in finding.message
    assert err.value.exit_code == ExitCode.BAD_CONFIG and "constraints.txt" in finding.hint


def test_bitsandbytes_is_checked_only_for_4bit_runs(monkeypatch) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda dist: "0.60.0" if dist == "bitsandbytes" else real(dist))
    monkeypatch.setattr(guard, "_check_private", lambda: None)  # the private names need torch: not here
    guard.check_versions(quantized=False)
    with pytest.raises(PreflightError, match="pre-flight") as err:
        guard.check_versions(quantized=True)
    assert err.value.findings[0].source == "bitsandbytes 0.60.0"


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--fsdp_version", "1"], "fsdp_version"),
        (["--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP"], "fsdp_auto_wrap_policy"),
        (["--method", "reward"], "method"),  # the trace builds a causal LM, not a sequence classifier
    ],
)
def test_settings_the_trace_does_not_build_are_refused(flags, key) -> None:
    cfg = check(FSDP2, [*LORA, *flags]).config
    with pytest.raises(PreflightError) as err:
        guard.check_settings(cfg)
    assert err.value.findings[0].rule == "TR002" and err.value.findings[0].key == key


def test_the_fsdp2_lora_run_is_accepted_and_a_cpu_run_is_not() -> None:
    guard.check_settings(check(FSDP2, LORA).config)
    with pytest.raises(PreflightError, match="pre-flight") as err:
        guard.check_settings(check(FSDP2, LORA).config, on_cpu=True)
    assert err.value.findings[0].key == "use_cpu"


def _trace() -> dict:
    return {
        "peak_allocated_gib": 5.061,
        "peak_phase": "backward: last layer",
        "categories_gib": {"activations (forward and recompute)": 2.252, "sharded parameters": 1.889},
        "layers": 32,
        "layers_traced": [3, 4],
        "extrapolated": True,
        "tflops_per_step": 200.0,
        "comm_gb_per_step": {"all-gather": 27.3, "reduce-scatter": 0.07},
        "world_size": 8,
        "wall_s": 24.0,
        "mesh": None,
        "notes": ["flash_attention_2 stood in by SDPA"],
    }


def test_the_trace_is_printed_beside_the_plan_with_the_difference() -> None:
    plan = {
        "training_peak_gib": 5.13,
        "peak_phase": "last layer's backward",
        "step_time": {"tflops_per_step_per_gpu": 208.0, "comm_gb_per_step_per_gpu": 28.1},
    }
    trace = _trace()
    trace["comparison"] = c = compare(plan, trace)
    assert c["peak_difference"] == pytest.approx((5.13 - 5.061) / 5.061, abs=1e-4)
    assert c["tflops_difference"] == pytest.approx(0.04) and c["comm_difference"] == pytest.approx(0.026, abs=1e-3)
    text = format_trace(trace)
    assert "3 and 4 of 32 decoder layers traced" in text and "extrapolated linearly" in text
    assert "peak allocated 5.06 GiB (backward: last layer)" in text and "plan +1.4%" in text
    assert "activations (forward and recompute)" in text and "note: flash_attention_2" in text
    assert "cannot see:" in text and "caching allocator" in text and "MoE routing" in text
    assert "host memory" not in text
    offloaded = format_trace({**trace, "host_categories": ["sharded parameters", "optimizer state"]})
    assert "1.89 GiB (host memory, cpu_offload: not in the peak)" in offloaded


def test_only_the_plan_command_imports_the_trace_and_only_inside_a_function() -> None:
    """The trace package is the rank side (torch at import): the launcher reaches it lazily, from `plan --trace`."""
    importers = []
    for path in (REPO / "fsdp_tune").rglob("*.py"):
        if "trace" in path.relative_to(REPO / "fsdp_tune").parts[:1]:
            continue
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fsdp_tune.trace"):
                importers.append((path.name, node.module, id(node) in top))
    lazy = [("run_cmds.py", "fsdp_tune.trace", False), ("run_cmds.py", "fsdp_tune.trace.run", False)]
    assert sorted(importers) == lazy
