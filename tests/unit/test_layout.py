"""The shape of the package: no import circles (lazy imports inside functions count), short functions. A newcomer
reads the tree as the data path; these keep it so. Modules have no line cap: a file holds one topic, as long as the
topic needs (STYLE.md "Split by topic, never by a line count")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "fsdp_tune"
MAX_FUNCTION_LINES = 60
LONG_REASON = "long because"  # a function may run past the limit when its docstring says why


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every fsdp_tune module this file imports, at any depth (function bodies too), with the packages whose
    __init__ Python runs on the way."""
    found: set[str] = set()
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for name in names:
            if not name.startswith("fsdp_tune"):
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix != me:
                    found.add(prefix)
    return found


# The packages as layers, lowest first: a package imports only from layers below its own (function-local imports
# count), so the data path reads one way and no two packages lean on each other. A module at the top of fsdp_tune
# (errors.py, ...) is a package of its own here.
LAYERS = (
    ("fsdp_tune", "assets", "errors", "printable", "redact", "runfiles", "typed"),  # plain data, file names, escapes
    # each training method's torch-free row (one entry per method): plain data every layer above reads by its traits
    # (the method's rank hook is the worker's: worker/methods/)
    ("methods",),
    ("summary",),  # the typed run summary
    ("config",),  # files and flags -> the typed RunConfig
    ("sources", "schedulers"),  # a model's config (the model door), the data's rows; a scheduler's topology
    ("rewards",),  # GRPO's rewards (a reward model's config through the model door)
    ("models",),  # the builtin models fsdp-tune builds
    ("decide",),  # every decision: the machine, derived settings, the rank spec
    ("rules",),  # findings on the config and its decisions
    ("validate", "planner"),  # the one check; the memory and step-time plan
    ("rundir", "output"),  # the run folder; every text a person reads
    ("preflight",),  # this machine and these files, before any rank
    ("worker",),  # the ranks
    ("trace", "tools"),  # plan --trace (the ranks' builders, faked); chat, merge, report
    ("launch",),  # train's steps and torchrun
    ("cli",),
    ("__main__",),
)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_packages_import_only_the_layers_below_them() -> None:
    modules = _modules()
    layer = {package: i for i, names in enumerate(LAYERS) for package in names}
    unknown = {_package(m) for m in modules} - set(layer)
    assert not unknown, f"packages without a layer in LAYERS: {sorted(unknown)}"
    wrong = []
    for name, path in sorted(modules.items()):
        mine = _package(name)
        for target in sorted(_imports(path, modules)):
            theirs = _package(target)
            if theirs != mine and theirs != "fsdp_tune" and layer[theirs] >= layer[mine]:
                wrong.append(f"{name} ({mine}, layer {layer[mine]}) imports {target} ({theirs}, layer {layer[theirs]})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_functions_are_short_or_say_why() -> None:
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                doc = ast.get_docstring(node) or ""
                if length > MAX_FUNCTION_LINES and LONG_REASON not in doc:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, "functions over 60 lines without a reason in their docstring:\n" + "\n".join(long)


def test_package_inits_import_nothing_of_ours() -> None:
    """A package's __init__ that imports its own modules is where circles start: none does."""
    modules = _modules()
    offenders = [str(p.relative_to(REPO)) for p in PACKAGE.rglob("__init__.py") if _imports(p, modules)]
    assert not offenders, offenders


# A path to one of our own files, as docstrings and comments name them: package folders, tests, scripts.
OWN_PATH = re.compile(
    r"(?<![\w./-])((?:fsdp_tune/)?(?:worker|launch|config|rules|planner|sources|output|tools|cli|models)/[\w/]+\.py"
    r"|tests/[\w/]+\.py|scripts/[\w]+\.(?:py|sh))\b"
)


def test_files_named_in_the_code_exist() -> None:
    """Docstrings and comments that point a reader at one of our files point at one that exists (a move or a
    split updates them): package paths are read from fsdp_tune/, the others from the repository."""
    stale = []
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        text = path.read_text()
        for m in OWN_PATH.finditer(text):
            ref = m.group(1).removeprefix("fsdp_tune/")
            if not ((PACKAGE / ref).exists() or (REPO / ref).exists()):
                stale.append(f"{path.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1} names {m.group(1)}")
    assert not stale, "files named that do not exist:\n" + "\n".join(stale)


def test_every_test_lives_in_a_layer() -> None:
    """A test's folder is its layer and gives it its marker (tests/conftest.py): unit, lib, dist or gpu."""
    from tests.conftest import LAYERS

    tests = REPO / "tests"
    found = tests.rglob("test_*.py")
    outside = [str(p.relative_to(REPO)) for p in found if p.relative_to(tests).parts[0] not in LAYERS]
    assert not outside, f"tests outside the layer folders {LAYERS}: {outside}"
    assert all((tests / layer / "__init__.py").exists() for layer in LAYERS)


def _attribute_reads(attr: str, skip_owner: tuple[str, ...] = ()) -> list[str]:
    """Modules (relative to fsdp_tune/) and lines reading `.attr`, other than on an object named in skip_owner."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == attr:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in skip_owner:
                    continue
                if isinstance(owner, ast.Attribute) and owner.attr in skip_owner:
                    continue
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_whether_a_run_is_on_cpu_has_one_definition() -> None:
    """`use_cpu` (the config's) and a Machine's `cuda` are read where the run's machine is decided
    (decide/derived.py runs_on_cpu) and nowhere else: the rules, the planner, plan, the dry run and the trace ask it
    (config/ writes the setting, decide/env.py hides a machine's GPUs from a CPU run it decided, decide/spec.py hands
    the decision to the Trainer as TrainingArguments' use_cpu: TrainerArgs.kwargs)."""
    cpu = [
        r for r in _attribute_reads("use_cpu") if not r.startswith(("config/", "decide/derived.py", "decide/spec.py"))
    ]
    cuda = _attribute_reads("cuda", skip_owner=("torch", "version"))
    cuda = [r for r in cuda if not r.startswith(("decide/derived.py", "decide/env.py"))]
    assert not cpu and not cuda, f"decide it with decide/derived.py runs_on_cpu or Derived.on_cpu: {cpu + cuda}"
