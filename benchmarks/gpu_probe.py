"""The GPU check's compatibility probe: the machine's library versions against fsdp-tune, in seconds, before any
model is built (benchmarks/gpu_check.py runs it first).

- every package's version and where it came from (the image, or the wheels carried into the private folder);
- every fsdp_tune module imported;
- every `import` / `from X import Y` of torch, transformers, accelerate, peft, trl, datasets, bitsandbytes,
  safetensors, tokenizers and huggingface_hub anywhere in fsdp_tune/ and the check's own modules (function
  bodies too: most are lazy), resolved against the installed versions; one inside `try: ... except ImportError`
  is a version fallback and only noted;
- the library members fsdp-tune reaches by attribute or overrides (SFTTrainer's methods its trainer subclass
  replaces, with the parameters it passes), which no import statement shows;
- each scenario's rank spec decided as `train` decides it, its SFTConfig arguments against the installed fields
  and its torchrun command line against the installed torchrun (decisions(), run by gpu_check.py);
- the device stages (benchmarks/gpu_cuda_probe.py), each bounded in a process of its own: the CUDA context, the
  card's bf16 matmul rate, pinned host memory, NCCL beside gloo in one process, bitsandbytes' 4-bit kernels; one
  that hangs is reported and ended, and the check goes on.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBS = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "bitsandbytes", "safetensors", "tokenizers")
LIBS += ("huggingface_hub",)
DISTS = (*LIBS, "typer", "click", "PyYAML", "pyarrow", "pandas", "xxhash", "dill", "multiprocess", "numpy", "fsspec")
SCANNED = [REPO / "fsdp_tune", *(REPO / "benchmarks").glob("gpu_*.py")]
# (module, attribute path, parameters fsdp-tune passes): members reached by attribute or overridden
MEMBERS = (
    ("torch.distributed.fsdp._fully_shard._fully_shard", "_init_default_mesh", ()),  # worker/cpu_fsdp.py
    ("torch._C._nn", "_parse_to", ()),  # worker/loading/sharded.py
    ("trl", "SFTTrainer.save_model", ("output_dir", "_internal_call")),  # worker/training/trainer.py overrides these
    ("trl", "SFTTrainer._save_checkpoint", ("model", "trial")),
    ("trl", "SFTTrainer.compute_loss", ("model", "inputs")),
    ("trl", "SFTTrainer._load_from_checkpoint", ("resume_from_checkpoint", "model")),
    ("trl", "SFTTrainer._get_output_dir", ("trial",)),
    ("trl", "SFTTrainer._finish_current_push", ()),  # worker/saving/hub.py
    ("accelerate.utils.fsdp_utils", "_find_final_norm", ()),
    # worker/training/trainer.py: a FULL checkpoint is the adapter file (the Trainer's save_fsdp_model skipped)
    ("transformers.trainer", "save_fsdp_model", ()),
    ("trl", "SFTTrainer._save_optimizer_and_scheduler", ("output_dir",)),
    ("trl", "SFTTrainer._load_best_model", ()),
)


def versions(site: str | None) -> dict[str, str]:
    """name -> "VERSION (image)" | "VERSION (carried)" | "missing"."""
    out = {"python": sys.version.split()[0]}
    for name in DISTS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
            continue
        where = str(dist.locate_file(""))
        out[name] = f"{dist.version} ({'carried' if site and where.startswith(site) else 'image'})"
    return out


def _optional_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside a `try:` whose handlers take ImportError (a version fallback)."""
    names = {"ImportError", "ModuleNotFoundError", "Exception"}
    marked: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            h.type is None or any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(h.type))
            for h in node.handlers
        ):
            marked |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return marked


def library_imports() -> list[tuple[str, str, str | None, bool]]:
    """(where, module, name or None, optional) for each import of LIBS in the scanned files."""
    found = []
    for root in SCANNED:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            tree = ast.parse(path.read_text())
            optional = _optional_nodes(tree)
            for node in ast.walk(tree):
                where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Import):
                    found += [(where, a.name, None, id(node) in optional) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found += [(where, node.module, a.name, id(node) in optional) for a in node.names]
    return [f for f in found if f[1].split(".")[0] in LIBS]


def _resolve(module: str, name: str | None) -> None:
    mod = importlib.import_module(module)
    if name is not None and not hasattr(mod, name):
        importlib.import_module(f"{module}.{name}")  # a submodule not yet imported


def check_imports() -> tuple[list[str], list[str], int]:
    """(failures, fallbacks noted, imports checked)."""
    failures, notes, seen = [], [], set()
    imports = library_imports()
    for where, module, name, optional in imports:
        if (module, name) in seen:
            continue
        seen.add((module, name))
        try:
            _resolve(module, name)
        except Exception as err:  # noqa: BLE001 - every kind of import failure is the finding
            text = f"{where}: {'from ' + module + ' import ' + name if name else 'import ' + module}: {err}"
            (notes if optional else failures).append(text)
    return failures, notes, len(seen)


def check_members() -> list[str]:
    failures = []
    for module, path, params in MEMBERS:
        try:
            obj = importlib.import_module(module)
            for part in path.split("."):
                obj = getattr(obj, part)
            if params:
                missing = [p for p in params if p not in inspect.signature(obj).parameters]
                if missing:
                    failures.append(f"{module}.{path}: no parameter {', '.join(missing)}")
        except Exception as err:  # noqa: BLE001
            failures.append(f"{module}.{path}: {type(err).__name__}: {err}")
    return failures


def import_fsdp_tune() -> list[str]:
    import fsdp_tune

    failures = []
    for info in pkgutil.walk_packages(fsdp_tune.__path__, "fsdp_tune."):
        if info.name.endswith("__main__"):
            continue  # running them is the CLI
        try:
            importlib.import_module(info.name)
        except Exception as err:  # noqa: BLE001
            failures.append(f"{info.name}: {type(err).__name__}: {err}")
    return failures


def run(site: str | None, device: str) -> dict:
    """Everything above but the decisions; "ok" when nothing failed. The device stages run in their own processes
    beside the imports here (each bounded: a hang costs its bound, whatever comes after)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.gpu_cuda_probe import run_stages

    started = time.time()
    found = {"versions": versions(site)}
    with ThreadPoolExecutor(1) as pool:
        stages = pool.submit(run_stages, device)
        found["fsdp_tune_modules"] = import_fsdp_tune()
        found["library_imports"], found["fallbacks"], found["imports_checked"] = check_imports()
        found["library_members"] = check_members()
        imports_s = time.time() - started
        found["device_stages"] = stages.result()
    found["parts"] = {
        "imports_s": round(imports_s, 1),
        "device_s": round(sum(r["seconds"] for r in found["device_stages"]), 1),
    }
    found["device"] = [f"{r['stage']}: {r['detail']}" for r in found["device_stages"] if not r["ok"]]
    failed = ("fsdp_tune_modules", "library_imports", "library_members", "device")
    found["ok"] = not any(found[k] for k in failed)
    return found


def lines(found: dict) -> list[str]:
    out = ["versions: " + ", ".join(f"{k} {v}" for k, v in found["versions"].items())]
    out.append(
        f"imports: {found['imports_checked']} library imports of fsdp-tune resolved"
        f"{'' if not found['library_imports'] else ', ' + str(len(found['library_imports'])) + ' FAILED'}; "
        f"{len(MEMBERS)} members checked ({len(found['library_members']) or 'none'} missing); fsdp_tune modules: "
        f"{len(found['fsdp_tune_modules']) or 'none'} failed to import"
    )
    for r in found["device_stages"]:
        out.append(
            f"  device {r['stage']:<8} {'ok    ' if r['ok'] else 'FAILED'} {r['seconds']:>5.1f} s  {r['detail']}"
        )
    for key in ("fsdp_tune_modules", "library_imports", "library_members"):
        out += [f"  FAILED {key}: {x}" for x in found[key]]
    out += [f"  note (a fallback, guarded): {x}" for x in found["fallbacks"]]
    return out


def decisions(items: list[tuple[str, list[str], str, bool]], out_dir: str) -> tuple[list[str], list[str], dict]:
    """Each scenario's rank spec decided as `train` decides it (validation, the machine's pre-flight, PF050
    included), its trainer arguments checked against the installed SFTConfig's fields (the ranks build it
    from them) and its torchrun command line against the installed torchrun's: (lines, failures). `items`:
    (name, train flags, expected, simulated) with expected "run" or "refused" (by the memory pre-flight);
    simulated: decided for a simulated H200 (a GPU scenario's flags checked from a CPU machine). The third value:
    name -> the rules that refused the scenario on this machine, for each scenario the pre-flight refused."""
    import trl
    from trl import SFTConfig

    from fsdp_tune.config.methods import row_of
    from fsdp_tune.decide.machine import Machine, probe
    from fsdp_tune.errors import FsdpTuneError
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.worker.training.spelling import installed_names

    here = probe()
    h200 = Machine(cuda=True, gpus=1, gpu_names=("NVIDIA H200",), driver_version="580.159.03", gpu_memory_mib=(143771,))
    lines, failures, refused = [], [], {}
    for name, args, where, simulated in items:
        argv = [*args[2:], "--output_dir", f"{out_dir}/{len(lines)}"]
        try:
            planned = plan_run(args[1], argv, lambda _: None, machine=h200 if simulated else here)
            errors = [f for f in planned.machine_findings if f.severity.value == "error"]
            if errors and not simulated:
                refused[name] = sorted({f.rule for f in errors})
            if where != "refused" and errors:
                raise FsdpTuneError("; ".join(f"{f.rule}: {f.message}" for f in errors))
            if where == "refused":
                found = {f.rule for f in errors}
                lines.append(f"  {name}: refused before launch ({', '.join(sorted(found)) or 'NOT refused'})")
                if "PF050" not in found:
                    failures.append(f"{name}: not refused by the memory pre-flight")
                continue
            config_class = getattr(trl, row_of(planned.spec.method.name).config_class, SFTConfig)  # SFT's, GRPO's
            installed_names(
                planned.spec.trainer_args.kwargs(), config_class
            )  # the installed trl/transformers take them
            torchrun_takes(planned.spec)
            lines.append(f"  {name}: {_decided(planned.spec)}" + (" (on a simulated H200)" if simulated else ""))
        except Exception as err:  # noqa: BLE001 - whatever stops the decision is the finding
            found = [
                f"{f.rule} {f.key}: {f.message}" for f in getattr(err, "findings", []) if f.severity.value == "error"
            ]
            text = f"{type(err).__name__}: {err}" + ("".join(f"\n    {x}" for x in found))
            failures.append(f"{name}: {text[:1500]}")
            lines.append(f"  {name}: FAILED {text[:1500]}")
    return lines, failures, refused


def _decided(spec) -> str:
    offload = "cpu_offload" if spec.fsdp_config.cpu_offload else "no offload"
    save = f"save {spec.save.final}/{spec.save.resume}, checkpoints {spec.save.checkpoint}"
    return (
        f"{spec.device}, FSDP{spec.fsdp_version}, {spec.world.world_size} rank(s), backend {spec.backend}, "
        f"loading {spec.loading.path}, {offload}, checkpointing {spec.checkpointing}, {save}"
    )


def torchrun_takes(spec) -> None:
    """The installed torchrun parses the command line fsdp-tune gives it (torch 2.11's refused --shutdown_timeout,
    which 2.13 added): argparse's own message, not a usage screen on every scenario."""
    import contextlib
    import io

    from torch.distributed.run import get_args_parser

    from fsdp_tune.launch.torchrun import command

    argv = command(spec)[3:]  # after `python -m torch.distributed.run`
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            get_args_parser().parse_args(argv)
    except SystemExit:
        said = err.getvalue().strip().splitlines()
        raise ValueError(f"torchrun refuses fsdp-tune's command line: {said[-1] if said else argv}") from None
