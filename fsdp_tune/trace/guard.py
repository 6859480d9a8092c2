"""What the trace leans on that no library promises to keep: torch's private memory tracker, fake process group and
fake tensors, TRL's kernel internals, bitsandbytes' ops. Each is checked against the versions the trace was
written for, and a change is refused up front (TR001) rather than traced wrongly; a setting the trace does not
simulate is refused too (TR002). Both exit 2 in the house voice."""

from __future__ import annotations

from importlib import metadata

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import runs_on_cpu
from fsdp_tune.errors import Finding, PreflightError, Severity

# (distribution, lowest major.minor, highest major.minor) the trace was checked against
CHECKED = {
    "torch": ((2, 13), (2, 13)),  # FSDPMemTracker's internals, fake_pg, FakeTensorMode(allow_non_fake_inputs)
    "trl": ((1, 16), (1, 16)),  # chunked_logprob's _use_triton, _forward_kernel, _backward_kernel, _addmm_fp32
    "transformers": ((5, 24), (5, 24)),
    "peft": ((0, 21), (0, 21)),
    "accelerate": ((1, 15), (1, 15)),
    "bitsandbytes": ((0, 50), (0, 50)),  # gemm_4bit's fake kernel, fix_4bit_weight_quant_state_from_module
}
PRIVATE = (  # (module, attribute): the private names the trace calls or replaces
    ("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker"),
    ("torch.distributed._tools.fsdp2_mem_tracker", "_FSDPRefType"),
    ("torch.testing._internal.distributed.fake_pg", "FakeStore"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    ("trl.kernels.chunked_logprob", "_use_triton"),
    ("trl.kernels.chunked_logprob", "_addmm_fp32"),
    ("trl.trainer.utils", "add_fused_lm_head"),
)
TRACKER_ATTRS = ("_update_peak_stats", "_fsdp_param_group_post_backward", "_update_and_maybe_create_winfos")


def version_tuple(text: str) -> tuple[int, int]:
    major, minor = text.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def refusal(rule: str, key: str, source: str, message: str, hint: str) -> PreflightError:
    return PreflightError([Finding(rule, Severity.ERROR, key, source, message, hint)])


def check_versions(quantized: bool) -> None:
    """TR001 when an installed library is outside what the trace was checked against, or a private name moved."""
    for dist, (low, high) in CHECKED.items():
        if dist == "bitsandbytes" and not quantized:
            continue
        try:
            found = metadata.version(dist)
        except metadata.PackageNotFoundError:
            raise refusal("TR001", "--trace", dist, f"{dist} is not installed", f"pip install {dist}") from None
        if not low <= version_tuple(found) <= high:
            span = ".".join(map(str, low)) + ("" if low == high else f"..{'.'.join(map(str, high))}")
            raise refusal(
                "TR001",
                "--trace",
                f"{dist} {found}",
                f"the trace runs {dist}'s private internals and was checked against {dist} {span}",
                "install the versions in constraints.txt (make setup), or plan without --trace",
            )
    _check_private()


def _check_private() -> None:
    import importlib

    for module, name in PRIVATE:
        try:
            ok = hasattr(importlib.import_module(module), name)
        except ImportError:
            ok = False
        if not ok:
            raise refusal(
                "TR001",
                "--trace",
                f"{module}.{name}",
                "a private name the trace relies on is gone",
                "install the versions in constraints.txt (make setup), or plan without --trace",
            )
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    missing = [a for a in TRACKER_ATTRS if not hasattr(FSDPMemTracker, a)]
    if missing:
        raise refusal(
            "TR001",
            "--trace",
            "torch FSDPMemTracker",
            f"FSDPMemTracker lost {', '.join(missing)}",
            "install the versions in constraints.txt (make setup), or plan without --trace",
        )


def check_settings(cfg: RunConfig, on_cpu: bool | None = None) -> None:
    """TR002 for what the trace does not build the way the ranks would; `on_cpu`: the plan is for a CPU run
    (None: as the config describes it, decide/derived.py runs_on_cpu)."""
    f, p = cfg.fsdp, cfg.parallelism
    reasons = []
    if runs_on_cpu(cfg) if on_cpu is None else on_cpu:
        reasons.append(("use_cpu", "the trace simulates GPU ranks; a CPU run's plan is its host RSS", "GPUs"))
    if f.version != 2:
        reasons.append(("fsdp_version", "FSDP1 (flat parameters) is not traced", "--fsdp_version 2"))
    if f.auto_wrap_policy != "TRANSFORMER_BASED_WRAP":
        reasons.append(
            (
                "fsdp_auto_wrap_policy",
                f"{f.auto_wrap_policy}: the trace makes decoder-layer units",
                "TRANSFORMER_BASED_WRAP",
            )
        )
    if p.enabled and (p.tp_size > 1 or p.sp_size > 1):
        reasons.append(("parallelism_config", "tensor or sequence parallelism is not traced", "dp or cp only"))
    if p.enabled and p.ep_size > 1:  # the trace builds accelerate's FSDP2 units, not transformers' DistributedConfig
        reasons.append(("ep_size", "expert parallelism (transformers' DistributedConfig) is not traced", "ep_size 1"))
    if cfg.quantization.use_8bit_quantization:
        reasons.append(("use_8bit_quantization", "8-bit (LLM.int8) weights are not traced", "4-bit or none"))
    if row_of(cfg.run.method).head != "lm":  # the trace builds a causal LM; a reward model is a sequence classifier
        reasons.append(
            ("method", f"{cfg.run.method}: a sequence classifier's score head is not traced", "--method dpo or sft")
        )
    if row_of(cfg.run.method).generates:  # generate() samples and tests for the end at every token
        why = (
            f"{cfg.run.method}: its generation is not traced (transformers' generate samples each token and checks "
            "every rank for the end, reading values that fake tensors do not have); its training pass is SFT's"
        )
        reasons.append(("method", why, "--method sft (the training pass; the plan's generation phase is arithmetic)"))
    if reasons:
        key, message, fix = reasons[0]
        raise refusal("TR002", key, "--trace", message, f"trace a variant with {fix}, or plan without --trace")
