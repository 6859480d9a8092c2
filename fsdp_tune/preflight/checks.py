"""Checks that depend on this machine and these files, run by `train` before any rank starts.

`validate-config` checks the configuration; this checks whether it can run here: files exist and hold
the expected fields, libraries are importable, the output dir is safe to write. No torch import.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.datafiles import Counted, Look
from fsdp_tune.decide.machine import Machine, visible_gpus
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight import reach
from fsdp_tune.preflight.disk import check_disk
from fsdp_tune.preflight.memory import check_memory
from fsdp_tune.preflight.vision import largest, vision_data_findings
from fsdp_tune.rundir import outdir, ownership
from fsdp_tune.runfiles import links_in
from fsdp_tune.sources import versions
from fsdp_tune.sources.model import ModelFacts, hub_cached, offline
from fsdp_tune.sources.modelcheck import check_model_folder
from fsdp_tune.sources.weights import check_weights

BUILTIN_MODEL_PREFIX = "builtin:"


def _err(rule: str, key: str, message: str, hint: str = "", source: str = "command line") -> Finding:
    return Finding(rule, Severity.ERROR, key, source, message, hint)


def _offline() -> bool:
    return offline("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).exists()


def check_machine(
    cfg: RunConfig, spec: RankSpec, machine: Machine, resume_requested: bool, counted: tuple[Counted, ...] = ()
) -> list[Finding]:
    """`counted`: what the data pre-flight counted (check_data): the largest image, for the memory plan."""
    findings: list[Finding] = []
    findings += _model(cfg, spec.model.facts)
    findings += _libraries(cfg, spec, machine)
    findings += reach.port_findings(spec)
    findings += _output_dir(cfg, spec, resume_requested)
    # last: it plans the run (seconds), on GPU machines only
    findings += check_memory(cfg, spec, machine, largest(counted))
    return findings


def check_files(cfg: RunConfig) -> list[Finding]:
    """What `validate-config` can see of a launch's files, without torch and without the network: a local model
    folder (PF002, PF005-PF007) and every local data source, located, read and its format detected
    (decide/datafiles.py), its rows checked (preflight/data.py), as train's pre-flight does, without tokenizing.
    What the launch would find missing or unreadable here is an error here too (#48). Hub ids (models, datasets)
    are left to train's pre-flight: a config is often checked on a machine other than the one that runs it; and
    what the config does not name (an Accelerate YAML alone has no model and no data) is not asked for."""
    from fsdp_tune.decide.data import data_spec, read_files
    from fsdp_tune.decide.derived import derive
    from fsdp_tune.preflight.data import check_sources

    d = derive(cfg)
    name = cfg.model.model_name_or_path
    findings = _model(cfg, d.model) if name and _looks_like_path(name) else []  # builtin: FT085
    files = read_files(cfg)
    data = data_spec(cfg, d, files)
    local = [(s, look) for s, look in zip(data.sources, files, strict=True) if look.local]
    if not local:
        return findings
    _, found = check_sources(tuple(s for s, _ in local), tuple(look for _, look in local), None, cfg.run.method)
    return findings + found


def _model(cfg: RunConfig, facts: ModelFacts) -> list[Finding]:
    """The model's files, as the door found them when the run was decided (`ModelSpec.facts`)."""
    name = cfg.model.model_name_or_path
    if not name:
        return [
            _err(
                "PF001",
                "--model_name_or_path",
                "no model given",
                "--model_name_or_path meta-llama/Llama-2-7b-hf (or a local folder, or builtin:tiny-llama)",
            )
        ]
    if name.startswith(BUILTIN_MODEL_PREFIX):
        from fsdp_tune.sources.builtin import PRESETS

        if name.removeprefix(BUILTIN_MODEL_PREFIX) not in PRESETS:
            return [
                _err(
                    "PF001",
                    "--model_name_or_path",
                    f"unknown builtin model {name}",
                    f"one of: {', '.join(BUILTIN_MODEL_PREFIX + p for p in PRESETS)}",
                )
            ]
        return []
    if _looks_like_path(name):
        path = Path(facts.path or name)
        if facts.where != "local" or not path.is_dir():
            return [_err("PF002", "--model_name_or_path", f"{name} does not exist", "check the path")]
        if facts.config is None and facts.problem is None:
            return [
                _err("PF002", "--model_name_or_path", f"{name} has no config.json: not a Transformers model folder")
            ]
        found = check_weights(path, name)
        return found + check_model_folder(path, name, cfg.model.trust_remote_code, shapes=not found, facts=facts)
    return _hub_model(name, facts)


def _hub_model(name: str, facts: ModelFacts) -> list[Finding]:
    """A hub id: in the local cache, or a Hub that answers (offline: it must be in the cache)."""
    if facts.where == "cache" or hub_cached(name, "models"):
        return []
    if _offline():
        return [
            _err(
                "PF003",
                "--model_name_or_path",
                f"{name} is a hub id, the hub is offline (HF_HUB_OFFLINE) and the model is not in the local cache",
                "download it first, or point at a local folder",
            )
        ]
    return reach.hub_findings(name)


def check_data(spec: RankSpec, files: tuple[Look, ...], tokens=None) -> tuple[tuple[Counted, ...], list[Finding]]:
    """The data files as the spec was decided from them (`files`: decide/data.py read_files) checked, never
    written into the spec: unreadable files and bad rows reported with file and row (preflight/data.py), their
    rows tokenized as rank 0 will (preflight/tokens.py; `tokens`: a TokenCheck of this spec the caller goes on
    using, its tokenizer loaded once); what was counted of each source, beside the spec."""
    from fsdp_tune.preflight.data import check_sources
    from fsdp_tune.preflight.tokens import TokenCheck

    if spec.method.data != "sft":  # a preference method's rows: preference_check
        tokens = None
    elif tokens is None:
        tokens = TokenCheck(spec)
    counted, findings = check_sources(spec.data.sources, files, tokens, spec.method.name)
    findings += vision_data_findings(spec, counted)  # images for this model and trainer (preflight/vision.py)
    if spec.generating is not None and not any(f.severity is Severity.ERROR for f in findings):
        from fsdp_tune.preflight.rewards import check_rewards

        findings += check_rewards(spec, files)  # the user's rewards called on one row, in a process of their own
    return counted, findings


def _libraries(cfg: RunConfig, spec: RankSpec, machine: Machine) -> list[Finding]:
    trackers = reach.tracker_findings(cfg)
    found = [*_versions(spec), *_attention(cfg, spec), *_quantization(cfg), *_gpus(cfg, spec, machine)]
    return [*found, *trackers, *_hub(cfg)]


def _versions(spec: RankSpec) -> list[Finding]:
    """PF029: each installed library outside the versions fsdp-tune is tested with (sources/versions.py RANGES), a
    warning; a refusal where the run takes a path that was checked against a narrower range (FACTS: the CPU shim)."""
    source = "the installed libraries"
    findings = [
        Finding(
            "PF029", Severity.WARNING, name, source, versions.range_message(name, found), versions.install_hint(name)
        )
        for name, found, _ in versions.outside()
    ]
    if spec.cpu_fsdp_shim:
        holds, found = versions.fact_holds("cpu_shim")
        if not holds:
            library = versions.FACTS["cpu_shim"].library
            message = versions.fact_message("cpu_shim", found)
            findings = [f for f in findings if f.key != library]
            findings.append(_err("PF029", library, message, versions.fact_hint("cpu_shim"), source))
    return findings


def _attention(cfg: RunConfig, spec: RankSpec) -> list[Finding]:
    if not str(spec.model.attn_implementation or "").startswith("flash_attention"):
        return []
    key = "--use_flash_attn" if cfg.model.use_flash_attn else "--attn_implementation"
    if spec.device == "cpu":
        return [
            _err(
                "PF020",
                key,
                "flash-attention needs CUDA GPUs; this run is on CPU",
                f"drop {key} (SDPA is used)",
            )
        ]
    if importlib.util.find_spec("flash_attn") is None:
        return [
            _err(
                "PF020",
                key,
                "flash-attn is not installed",
                f"pip install flash-attn --no-build-isolation, or drop {key}",
            )
        ]
    return []


def _quantization(cfg: RunConfig) -> list[Finding]:
    if cfg.quantization.use_4bit_quantization and importlib.util.find_spec("bitsandbytes") is None:
        return [_err("PF021", "--use_4bit_quantization", "bitsandbytes is not installed", "pip install bitsandbytes")]
    return []


def _gpus(cfg: RunConfig, spec: RankSpec, machine: Machine) -> list[Finding]:
    findings = []
    w = spec.world
    # the machine's own count (probed, or a simulated node's), unless the rank spec narrows it (gpu_ids)
    narrowed = spec.env.get("CUDA_VISIBLE_DEVICES")
    gpus = None if spec.device == "cpu" else visible_gpus(narrowed) if narrowed is not None else machine.gpus
    if gpus is not None and gpus < w.nproc_per_node:
        findings.append(
            _err(
                "PF025",
                "num_processes",
                f"{w.nproc_per_node} processes per machine, but the ranks would see {gpus} GPU(s) here: one "
                "rank per GPU (NCCL)",
                f"--num_processes {gpus * w.nnodes}, or check CUDA_VISIBLE_DEVICES / gpu_ids",
            )
        )
    return findings


def _hub(cfg: RunConfig) -> list[Finding]:
    if not cfg.training.get("push_to_hub"):
        return []
    if _offline():
        return [
            _err(
                "PF023",
                "--push_to_hub",
                "the hub is offline (HF_HUB_OFFLINE): every save would fail to push",
                "drop --push_to_hub, or unset HF_HUB_OFFLINE",
            )
        ]
    token = (
        cfg.training.get("hub_token")
        or os.environ.get("HF_TOKEN")
        or Path("~/.cache/huggingface/token").expanduser().exists()
    )
    if not token:
        return [
            _err(
                "PF023",
                "--push_to_hub",
                "no Hugging Face token (HF_TOKEN or `hf auth login`)",
                "log in first, or drop --push_to_hub",
            )
        ]
    return []


def _output_dir(cfg: RunConfig, spec: RankSpec, resume_requested: bool) -> list[Finding]:
    out = Path(spec.output_dir)
    refused = outdir.no_run_folder(out)  # before the probe and the walk for links: `/` would walk everything
    if refused:
        return [refused]
    unwritable = _unwritable(out)
    if unwritable:
        return [_err("PF032", "--output_dir", unwritable, "choose a folder you can write to")]
    if spec.world.node_rank > 0:
        return []  # machines other than 0 share the output dir that machine 0 checks and owns
    if out.is_file():
        return [_err("PF030", "--output_dir", f"{out} is a file", "choose a folder")]
    links = links_in(out) if out.is_dir() else []
    if links:
        return [outdir.links_finding(out, links)]
    holder = ownership.holder_of(out)
    if holder:
        return [ownership.in_use_finding(out, holder)]
    folder = outdir.inspect(out)
    found = outdir.findings(folder, resume=resume_requested, overwrite=bool(cfg.run.overwrite_output_dir))
    return found + check_disk(cfg, spec)


def _unwritable(out: Path) -> str | None:
    """Why the output dir cannot be created or written, found by trying (a hidden temporary folder in the
    deepest existing ancestor, removed at once), or None. Permission bits alone miss read-only mounts and
    kernel file systems (/proc lets root "write" but creates nothing)."""
    existing = out
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return f"{out}: {existing} is a file, not a folder"
    try:
        probe = tempfile.mkdtemp(prefix=".fsdp-tune-probe-", dir=existing)
    except OSError as e:
        what = "cannot be written" if existing == out else f"cannot be created in {existing}"
        return f"{out} {what} ({e.strerror or e})"
    os.rmdir(probe)
    return None
