"""Pre-flight for data with images (after preflight/data.py read the files and preflight/images.py opened their
images): images for a model that reads none (PF082), and what TRL refuses for vision data (PF081, with TRL's
reason: the model kind's `refuses`, config/model_kinds.py), refused before any rank starts. No torch."""

from __future__ import annotations

from fsdp_tune.config.model_kinds import KINDS
from fsdp_tune.decide.datafiles import Counted
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.errors import Finding, Severity


def with_images(spec: RankSpec, counted: tuple[Counted, ...]) -> list[tuple[str, int]]:
    """(source, rows with images) of each source whose pre-flight found images (`counted`: check_data's)."""
    pairs = zip(spec.data.sources, counted, strict=False)
    return [(s.label, c.images["image_rows"]) for s, c in pairs if c.images and c.images.get("image_rows")]


def largest(counted: tuple[Counted, ...]) -> tuple[int, int] | None:
    """The largest image pre-flight found in the training data (width, height), for the memory plan."""
    sizes = [tuple(c.images["largest"]) for c in counted if c.images and c.images.get("images")]
    return max(sizes, key=lambda wh: wh[0] * wh[1]) if sizes else None


def vision_data_findings(spec: RankSpec, counted: tuple[Counted, ...]) -> list[Finding]:
    found = with_images(spec, counted)
    if not found:
        return []
    where, rows = found[0]
    kind = KINDS[spec.model.kind]
    if not kind.images:
        return [_no_vision(spec, where, rows)]
    out = []
    for refusal in kind.refuses:
        if _value(spec, refusal.key) == refusal.refused:
            message = f"--{refusal.key} {refusal.refused} with images in the data ({where}: {rows} rows): {refusal.why}"
            out.append(Finding("PF081", Severity.ERROR, f"--{refusal.key}", "command line", message, refusal.hint))
    return out


def _value(spec: RankSpec, key: str):
    """A refused setting's value as the ranks get it: the data spec's typed fields, else the trainer's argument."""
    typed = {"packing": spec.data.packing, "truncation_mode": spec.data.truncation_mode}
    return typed[key] if key in typed else spec.trainer_args.kwargs().get(key)


def _no_vision(spec: RankSpec, where: str, rows: int) -> Finding:
    name = spec.model.requested or spec.model.name_or_path
    config = spec.model.facts.config
    if config is None:
        message = (
            f"{where} has {rows} rows with images, and {name}'s config.json is not on this machine: fsdp-tune cannot "
            "tell whether the model reads images"
        )
        hint = "download the model first (hf download NAME), or point at its folder"
    else:
        message = (
            f"{where} has {rows} rows with images, and {name} reads no images ({config.get('model_type')}: no vision "
            "tower); its images would be dropped from every row"
        )
        hint = "train a vision-language model (Qwen2-VL, LLaVA: fsdp_tune/config/model_kinds.py), or drop the images"
    return Finding("PF082", Severity.ERROR, "--model_name_or_path", "command line", message, hint)
