"""An Accelerate YAML without fsdp_version runs FSDP2 (config/fsdp2.py): mapped as `convert --fsdp2` maps it, said
in one note; `fsdp_version: 1` keeps FSDP1; a strategy FSDP2 cannot express keeps FSDP1, warned; a checkpoint is
resumed only by the FSDP version that wrote it (PF051)."""

from __future__ import annotations

import json

import pytest

from fsdp_tune.launch.train import resolve_resume
from fsdp_tune.preflight.resume import fsdp_version_findings
from fsdp_tune.tools.convert import convert
from fsdp_tune.validate import check

NOTE = "no fsdp_version: FSDP2; `accelerate launch` would run FSDP1; `fsdp_version: 1` keeps it"


def _yaml(tmp_path, fsdp: str, top: str = "num_processes: 2\n") -> str:
    path = tmp_path / "accel.yaml"
    path.write_text(f"distributed_type: FSDP\n{top}fsdp_config:\n{fsdp}")
    return str(path)


def test_no_version_runs_fsdp2_with_fsdp1_keys_mapped(tmp_path) -> None:
    path = _yaml(
        tmp_path,
        "  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_backward_prefetch: BACKWARD_PRE\n"
        "  fsdp_use_orig_params: false\n  fsdp_offload_params: true\n",
    )
    checked = check(path, [])
    f = checked.config.fsdp
    assert (f.version, f.reshard_after_forward, f.cpu_offload) == (2, False, True)
    assert (f.sharding_strategy, f.backward_prefetch, f.use_orig_params) == (None, None, None)
    (note,) = checked.findings
    assert note.rule == "FT022" and note.severity.value == "note" and note.message.startswith(NOTE)
    assert "SHARD_GRAD_OP -> reshard_after_forward=false" in note.message
    assert "backward_prefetch, use_orig_params dropped" in note.message
    assert "absent: FSDP2" in str(checked.config.origin("fsdp.version"))


@pytest.mark.parametrize("how", ["file", "flag"])
def test_fsdp_version_1_written_out_keeps_fsdp1(tmp_path, how: str) -> None:
    body = "  fsdp_sharding_strategy: SHARD_GRAD_OP\n" + ("  fsdp_version: 1\n" if how == "file" else "")
    checked = check(_yaml(tmp_path, body), [] if how == "file" else ["--fsdp_version", "1"])
    f = checked.config.fsdp
    assert (f.version, f.sharding_strategy, f.reshard_after_forward) == (1, "SHARD_GRAD_OP", False)
    assert [(x.rule, x.severity.value) for x in checked.findings] == [("FT022", "warning")]  # deprecated


def test_a_strategy_fsdp2_cannot_express_keeps_fsdp1_warned(tmp_path) -> None:
    checked = check(_yaml(tmp_path, "  fsdp_sharding_strategy: NO_SHARD\n"), [])
    assert checked.config.fsdp.version == 1 and checked.config.fsdp.sharding_strategy == "NO_SHARD"
    (warning,) = checked.warnings
    assert warning.rule == "FT022" and "FSDP1 kept" in warning.message and "NO_SHARD" in warning.message


def test_hybrid_shard_over_machines_becomes_a_mesh(tmp_path) -> None:
    top = "num_machines: 2\nnum_processes: 16\nmain_process_ip: 10.0.0.1\n"
    path = _yaml(tmp_path, "  fsdp_sharding_strategy: HYBRID_SHARD\n", top=top)
    checked = check(path, [])
    p = checked.config.parallelism
    assert checked.config.fsdp.version == 2 and (p.enabled, p.dp_replicate_size, p.dp_shard_size) == (True, 2, 8)
    assert not checked.errors and not checked.warnings


def test_convert_writes_the_version_train_runs(tmp_path) -> None:
    """Without --fsdp2 the output says explicitly what train runs (FSDP2), with the note; the YAML reads back the
    same and without notes."""
    src = _yaml(tmp_path, "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_sync_module_states: true\n")
    out, notes, diff = convert(src, None, False, str(tmp_path / "o.yaml"), False)
    assert notes and notes[0].startswith(NOTE) and "  fsdp.version: 1 -> 2" in diff
    again = check(str(out), [])
    assert again.config.fsdp.version == 2 and not again.findings and "fsdp_version: 2" in out.read_text()


def _run_folder(tmp_path, version: int):
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "fsdp_tune_resolved.json").write_text(json.dumps({"spec": {"fsdp_version": version}}))
    return run


def test_resume_across_fsdp_versions_is_refused(tmp_path) -> None:
    run = _run_folder(tmp_path, 1)
    path = _yaml(tmp_path, "  fsdp_sharding_strategy: FULL_SHARD\n")
    checkpoint = run / "checkpoint-2"
    flags = ["--output_dir", str(run), "--resume_from_checkpoint", str(checkpoint)]
    cfg = check(path, flags).config
    assert resolve_resume(cfg, lambda _: None) == str(checkpoint.resolve())
    (f,) = fsdp_version_findings(str(checkpoint), cfg)
    assert f.rule == "PF051" and "written by FSDP1, and this launch runs FSDP2 (no fsdp_version" in f.message
    assert f.hint == "--fsdp_version 1 resumes it as it was written"
    assert fsdp_version_findings(str(checkpoint), check(path, [*flags, "--fsdp_version", "1"]).config) == []
