"""Every training method's row (config/methods.py), walked to the rank spec: what the spec says about the method
is the row's, the TRL config gets only its own fields, the planner's step and the rules follow the row's traits,
and nothing outside the row and the ranks' hook branches on a method's name (the hook's side is
tests/lib/test_method_hooks.py). A method added as a row gets all of this without a test of its own."""

from __future__ import annotations

import ast
import re

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
        name=name,
        data=row.data,
        head=row.head,
        reference_adapter=row.reference or row.copies_reference,
        truncation=row.truncation,
    )
    handed = spec.trainer_args.kwargs()
    assert set(handed) <= set(fields_of(name)), set(handed) - set(fields_of(name))
    assert spec.lora.task_type == ("SEQ_CLS" if row.head == "score" else "CAUSAL_LM")
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
        # context parallelism takes a loss summed over tokens of no reference and no generation (FT048)
        assert not row.context_parallel or (row.step.loss_over == "tokens" and not (row.reference or row.generates))
        assert not row.copies_reference or row.generates, name  # a generating method's reference (GenerationSpec)
        assert 1 <= row.panels <= len([m for m in row.metrics if "*" not in m.key]) or not row.metrics, name


# the only modules that may name a method: its entry (its row: fsdp_tune/methods/<name>.py, its rank hook:
# fsdp_tune/worker/methods/<name>.py); everything else reads the row's traits
ENTRY_FOLDERS = ("methods/", "worker/methods/")
NAMES = set(ROWS)
CONSTANTS = {"SFT", "DPO", "KTO", "REWARD", "GRPO", "RLOO"}  # names a module might keep a method's name under
# an expression that holds a method's name: cfg.run.method, spec.method.name, method, a dict's .get("method", ...)
METHODISH = re.compile(r"(\bmethod|\.name|\bmethod_name)$|\.get\([\"']method[\"']")


def _named(side: ast.expr) -> set[str]:
    """The method names an operand holds: a string, a name constant, or either inside a tuple, list or set."""
    if isinstance(side, ast.Constant) and isinstance(side.value, str):
        return {side.value} & NAMES
    if isinstance(side, ast.Name):
        return {side.id} & CONSTANTS
    if isinstance(side, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_named(e) for e in side.elts)) if side.elts else set()
    return set()


def _compares_a_method_name(tree: ast.AST) -> list[int]:
    """Lines comparing (==, !=, in, not in, is) a method's name with something that holds one, or any operand
    with a method-name constant (SFT, GRPO...), however it is spelled."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [s for s in sides if _named(s)]
        constant = any(isinstance(n, ast.Name) and n.id in CONSTANTS for s in sides for n in ast.walk(s))
        methodish = any(METHODISH.search(ast.unparse(s)) for s in sides if s not in named)
        if named and (constant or methodish):
            lines.append(node.lineno)
    return lines


def _in_an_entry(rel: str) -> bool:
    return any(rel.startswith(folder) for folder in ENTRY_FOLDERS)


def test_the_scan_finds_each_spelling() -> None:
    """The scan below would see a branch on a method's name in each way a module might write it."""
    branches = (
        'if cfg.run.method == "dpo": pass',
        "if spec.method.name != SFT: pass",
        'if method in ("kto", "grpo"): pass',
        "if name == GRPO: pass",
        'if row.get("method", "sft") == "sft": pass',
        "if RLOO in names: pass",
    )
    for source in branches:
        assert _compares_a_method_name(ast.parse(source)) == [1], source
    traits = ('if row.data == "sft": pass', 'if spec.method.data != "sft": pass', 'if loss == "sft": pass')
    for source in traits:
        assert _compares_a_method_name(ast.parse(source)) == [], source


def test_no_module_branches_on_a_methods_name() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if _in_an_entry(rel):
            continue
        found += [f"{rel}:{line}" for line in _compares_a_method_name(ast.parse(path.read_text()))]
    assert not found, "read the row's traits (config/methods.py row_of), not the method's name: " + ", ".join(found)
