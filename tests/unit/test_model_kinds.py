"""A model kind is one entry (config/model_kinds.py: its loading class, processor, families with their FSDP units and
planner facts, image data, settings), and the house reads its traits: no module outside the entry branches on a
kind's or a family's name, and none grows an `is_moe` / `is_vision` check of its own (#47). Experts are
sources/moe.py's, read the same way. By the source's syntax tree: no torch, nothing imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fsdp_tune.config.model_kinds import CAUSAL_LM, FAMILIES, KINDS, VISION_LANGUAGE, family_of, kind_of, kind_row

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "fsdp_tune"
ENTRIES = {"config/model_kinds.py", "sources/moe.py"}  # the kinds' entry, and what experts are
KIND_NAMES = {"CAUSAL_LM", "VISION_LANGUAGE"}  # the constants
KIND_VALUES = {CAUSAL_LM, VISION_LANGUAGE, *FAMILIES}  # the names as strings: kinds and families
OWN_CHECK = re.compile(r"^is_(moe|vision\w*|vlm|multimodal|multi_modal|causal_lm|text_only|language_model)$")


def _names(node: ast.AST) -> set[str]:
    """The kind names an operand spells: a constant, a module's constant (VISION_LANGUAGE, model_kinds.CAUSAL_LM)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KIND_VALUES:
        return {node.value}
    if isinstance(node, ast.Name) and node.id in KIND_NAMES:
        return {node.id}
    if isinstance(node, ast.Attribute) and node.attr in KIND_NAMES:
        return {node.attr}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    return set()


def branches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each comparison with a kind's or family's name, `match` case on one, and own kind check."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            spelled = set().union(*(_names(n) for n in (node.left, *node.comparators)))
            found += [(node.lineno, f"compares with {name}") for name in sorted(spelled)]
        elif isinstance(node, ast.MatchValue) and (spelled := _names(node.value)):
            found += [(node.lineno, f"match case {name}") for name in sorted(spelled)]
        name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None)
        if isinstance(name, str) and OWN_CHECK.match(name):
            found.append((getattr(node, "lineno", 0), f"its own kind check {name}"))
    return found


def test_no_module_branches_on_a_model_kinds_name_outside_its_entry() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ENTRIES:
            continue
        offenders += [f"fsdp_tune/{rel}:{line}: {what}" for line, what in branches(ast.parse(path.read_text()))]
    assert not offenders, "read the kind's traits (config/model_kinds.py KINDS) instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("if spec.model.kind == VISION_LANGUAGE: pass", True),
        ("x = kind_of(c) != model_kinds.CAUSAL_LM", True),
        ("ok = kind in ('vision_language', 'causal_lm')", True),
        ("match config['model_type']:\n    case 'llava': pass", True),
        ("if config.get('model_type') == 'qwen2_vl': pass", True),
        ("def is_moe(config): return True", True),
        ("if reach.is_vision: pass", True),
        ("if KINDS[spec.model.kind].images: pass", False),
        ("if str(task).upper() != 'CAUSAL_LM': pass", False),  # PEFT's task type, not a model kind
        ("row = KINDS[VISION_LANGUAGE]", False),
    ],
)
def test_the_check_sees_a_branch(source: str, caught: bool) -> None:
    assert bool(branches(ast.parse(source))) is caught


def test_each_kind_is_one_entry_read_through_its_traits() -> None:
    vision = kind_row({"vision_config": {}, "model_type": "llava"})
    assert vision is KINDS[VISION_LANGUAGE] and vision.images and vision.processor and vision.refuses
    assert family_of({"vision_config": {}, "model_type": "llava"}) is vision.families["llava"]
    text = kind_row(None)
    assert text is KINDS[kind_of({"model_type": "llama"})] and not (text.images or text.families or text.settings)
    assert family_of({"model_type": "llava"}) is None  # a family is its kind's: no vision tower, no family
