"""Every training method's row (config/methods.py), walked to the rank spec: what the spec says about the method
is the row's, the TRL config gets only its own fields, the planner's step and the rules follow the row's traits,
and nothing outside the row and the ranks' hook branches on a method's name (the hook's side is
tests/lib/test_method_hooks.py). A method added as a row gets all of this without a test of its own."""

from __future__ import annotations

import ast

import pytest

from fsdp_tune.config.methods import ROWS, fields_of, row_of
from fsdp_tune.decide.spec import MethodSpec
from fsdp_tune.planner.method import step_of
from fsdp_tune.validate import check
from tests.conftest import REPO, spec_for

LORA = ["--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--use_peft_lora", "--output_dir", "/tmp/m"]
PACKAGE = REPO / "fsdp_tune"


def _needs(row) -> list[str]:
    """What a row's method cannot run without: a generating method's rewards."""
    return ["--reward_funcs", "length_reward"] if row.generates else []


@pytest.mark.parametrize("name", list(ROWS))
def test_the_rank_spec_carries_the_rows_traits(name: str) -> None:
    row = ROWS[name]
    spec = spec_for(*LORA, "--method", name, *_needs(row))
    assert spec.method == MethodSpec(
        name=name, data=row.data, head=row.head, reference_adapter=row.reference, truncation=row.truncation
    )
    assert set(spec.trainer_args) <= set(fields_of(name)), set(spec.trainer_args) - set(fields_of(name))
    assert spec.lora["task_type"] == ("SEQ_CLS" if row.head == "score" else "CAUSAL_LM")
    # the Steps are the config's defaults where the run sets nothing
    assert spec.steps.per_device_train_batch_size == fields_of(name)["per_device_train_batch_size"]["default"]


@pytest.mark.parametrize("name", list(ROWS))
def test_the_planner_and_the_rules_read_the_row(name: str) -> None:
    row = ROWS[name]
    cfg = check(None, [*LORA, "--method", name]).config
    assert step_of(cfg) is row.step
    packed = check(None, [*LORA, "--method", name, "--packing", "true"])
    refused = [f for f in packed.errors if f.rule == "FT110" and f.key == "--packing"]
    assert bool(refused) is not row.packs, refused
    # TRL's default gradient checkpointing becomes FSDP's activation checkpointing where the row says so (FT116)
    assert cfg.fsdp.activation_checkpointing is row.recompute_with_fsdp


def test_rows_are_consistent() -> None:
    for name, row in ROWS.items():
        assert row.name == name and row_of(name) is row
        assert all(m.key.startswith("eval_") for m in row.eval_metrics), name
        assert (row.head == "score") == (not row.fused_head), name  # a score head has no LM head to fuse
        assert row.step.rows_with_grad >= 1 and (row.step.no_grad_forwards > 0) == row.reference, name
        assert bool(row.step.describe) == (name != "sft"), name
        assert 1 <= row.panels <= len([m for m in row.metrics if "*" not in m.key]) or not row.metrics, name


# modules that may name methods: the rows, the ranks' hooks, the rules of one method's own config fields (DPO's
# loss types, KTO's batches), and the CLI's option help
NAMING_ALLOWED = {"config/methods.py", "worker/training/methods.py", "rules/method.py", "rules/preference.py"}
NAMES = set(ROWS)


def _compares_a_method_name(tree: ast.AST) -> list[int]:
    """Lines comparing something `.method` (cfg.run.method, spec.method...) with a method's name."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = {s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)}
        attribute = any(isinstance(s, ast.Attribute) and s.attr in ("method", "name") for s in sides)
        methodish = attribute or any(isinstance(s, ast.Name) and s.id == "method" for s in sides)
        if methodish and names & NAMES:
            lines.append(node.lineno)
    return lines


def test_no_module_branches_on_a_methods_name() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel in NAMING_ALLOWED:
            continue
        found += [f"{rel}:{line}" for line in _compares_a_method_name(ast.parse(path.read_text()))]
    assert not found, "compare the row's traits (config/methods.py row_of), not the name: " + ", ".join(found)
