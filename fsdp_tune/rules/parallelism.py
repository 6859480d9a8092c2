"""accelerate's ParallelismConfig: CP/SP/TP/HSDP sizes against the world size and FSDP version; transformers'
DistributedConfig under expert parallelism (ep_size): against the world, the model and what LoRA can reach."""

from __future__ import annotations

import math
from collections.abc import Iterator

from fsdp_tune.config.methods import ROWS, row_of
from fsdp_tune.config.schema import ParallelismSettings, RunConfig
from fsdp_tune.decide.derived import Derived, evaluation, expert_parallel_size, mesh_active, mesh_sizes
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rules.registry import error, finding, rule, warning
from fsdp_tune.sources.classes import expert_parallel_plan
from fsdp_tune.sources.moe import EXPERT_COUNT_KEYS, param_targets


@rule("FT040", "parallelism", "parallelism_config_* flags without --use_parallelism_config are ignored")
def flags_without_enable(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.parallelism.enabled:
        return
    for name in cfg.parallelism.__dataclass_fields__:
        path = f"parallelism.{name}"
        if name != "enabled" and cfg.is_set(path):
            yield error(
                cfg,
                "FT040",
                path,
                "accelerate ignores parallelism_config settings unless the feature is switched on: "
                "this value would be silently dropped",
                "add --use_parallelism_config",
            )


@rule("FT041", "parallelism", "parallelism sizes must be at least 1")
def sizes_positive(cfg: RunConfig) -> Iterator[Finding]:
    for name in ParallelismSettings.SIZES:
        value = getattr(cfg.parallelism, name)
        if value is not None and value < 1:
            yield error(cfg, "FT041", f"parallelism.{name}", f"{name} must be at least 1, got {value}", "use 1 or more")


@rule("FT042", "parallelism", "context parallelism and sequence parallelism are exclusive")
def cp_and_sp(cfg: RunConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    if p.enabled and p.cp_size > 1 and p.sp_size > 1:
        yield error(
            cfg,
            "FT042",
            "parallelism.cp_size",
            f"cp_size={p.cp_size} and sp_size={p.sp_size}: context parallelism (ring attention) and "
            "Ulysses sequence parallelism are mutually exclusive",
            "set either cp_size or sp_size to 1",
        )


@rule("FT043", "parallelism", "context parallelism needs FSDP2")
def cp_needs_fsdp2(cfg: RunConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    if p.enabled and p.cp_size > 1 and cfg.fsdp.version != 2:
        yield error(
            cfg,
            "FT043",
            "parallelism.cp_size",
            f"cp_size={p.cp_size} needs FSDP2; this config is FSDP1",
            "set `fsdp_version: 2` (fsdp-tune convert --fsdp2)",
        )
    if p.enabled and cfg.fsdp.version == 1 and math.prod(mesh_sizes(cfg).values()) > 1 and p.cp_size == 1:
        yield error(
            cfg,
            "FT043",
            "parallelism.enabled",
            "a ParallelismConfig mesh works only with FSDP2 (accelerate refuses it with FSDP1)",
            "set `fsdp_version: 2`",
        )


@rule("FT044", "parallelism", "the mesh must cover the world size exactly")
def world_size(cfg: RunConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    if not p.enabled:
        return
    sizes = mesh_sizes(cfg)
    total = math.prod(sizes.values())
    n = cfg.launch.num_processes
    if total != n and total != 1:
        shown = " x ".join(f"{k}={v}" for k, v in sizes.items() if v != 1) or "1"
        yield error(
            cfg,
            "FT044",
            "parallelism.enabled",
            f"the parallelism sizes multiply to {total} ({shown}) but the world has {n} processes "
            f"({cfg.where('launch.num_processes')})",
            "make dp_replicate x dp_shard x tp x cp x sp equal num_processes",
        )


@rule("FT045", "parallelism", "TP/CP cannot run on pure data parallelism")
def tp_cp_pure_dp(cfg: RunConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    sizes = mesh_sizes(cfg)
    if p.enabled and (p.tp_size > 1 or p.cp_size > 1) and p.dp_replicate_size > 1 and sizes["dp_shard_size"] == 1:
        yield error(
            cfg,
            "FT045",
            "parallelism.dp_replicate_size",
            "tp/cp_size > 1 cannot be combined with pure data parallelism (dp_replicate_size > 1 and "
            "dp_shard_size == 1)",
            "shard instead: set dp_shard_size > 1",
        )


@rule("FT037", "parallelism", "FSDP2 needs a mesh dimension to shard over (dp_shard or cp above 1)")
def nothing_to_shard(cfg: RunConfig) -> Iterator[Finding]:
    """accelerate 1.15 refuses an FSDP2 mesh whose dp_shard and cp are both 1 (parallelism_config.py
    _validate_accelerator: 'no dimension for FSDP to shard across'); fsdp-tune's sharded loading would fail on the
    missing dp_shard_cp dimension. dp_replicate x 1 is pure data parallelism, which FSDP does not run."""
    p = cfg.parallelism
    if not mesh_active(cfg) or cfg.fsdp.version != 2:
        return
    sizes = mesh_sizes(cfg)
    if sizes["dp_shard_size"] == 1 and sizes["cp_size"] == 1:
        shown = " x ".join(f"{k}={v}" for k, v in sizes.items() if v != 1)
        yield error(
            cfg,
            "FT037",
            "parallelism.dp_shard_size",
            f"the mesh ({shown}) leaves FSDP2 no dimension to shard over: dp_shard_size and cp_size are both 1 "
            "(accelerate refuses it when the ranks prepare the model)",
            f"dp_shard_size {max(cfg.launch.num_processes // max(p.dp_replicate_size * p.tp_size, 1), 2)} "
            "with dp_replicate_size 1 (plain FSDP), or HSDP with dp_shard_size above 1",
        )


@rule("FT046", "parallelism", "sequence parallelism (DeepSpeed Ulysses) is not an FSDP feature")
def sp_needs_deepspeed(cfg: RunConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    if p.enabled and p.sp_size > 1:
        yield error(
            cfg,
            "FT046",
            "parallelism.sp_size",
            "sp_size > 1 is DeepSpeed's ALST/Ulysses sequence parallelism; fsdp-tune launches FSDP",
            "use context parallelism instead: --parallelism_config_cp_size N (FSDP2)",
        )


@rule("FT047", "parallelism", "settings that only act when their size is above 1")
def unused_handlers(cfg: RunConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    if p.cp_size == 1 and cfg.is_set("parallelism.cp_comm_strategy"):
        yield warning(cfg, "FT047", "parallelism.cp_comm_strategy", "ignored while cp_size is 1", "remove it")
    if p.sp_size == 1:
        for name in ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"):
            if cfg.is_set(f"parallelism.{name}"):
                yield warning(cfg, "FT047", f"parallelism.{name}", "ignored while sp_size is 1", "remove it")
    replicas_only = p.dp_replicate_size > 1 and p.dp_shard_size == 1 and p.tp_size == p.cp_size == 1
    if p.enabled and replicas_only and cfg.fsdp.version != 2:  # under FSDP2 it is refused: FT037
        yield warning(
            cfg,
            "FT047",
            "parallelism.dp_replicate_size",
            "dp_replicate_size > 1 with dp_shard_size 1 is plain replication: nothing is sharded",
            "use dp_shard_size > 1 (HSDP) or plain DDP",
        )


@rule("FT048", "parallelism", "context parallelism: SDPA attention, divisible lengths, loss-only eval, no packing")
def cp_runtime(cfg: RunConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    if not (p.enabled and p.cp_size > 1):
        return
    yield from cp_packing(cfg)
    yield from cp_method(cfg)
    if cfg.model.use_flash_attn or (cfg.model.attn_implementation or "sdpa") != "sdpa":
        path = "model.use_flash_attn" if cfg.model.use_flash_attn else "model.attn_implementation"
        yield error(
            cfg,
            "FT048",
            path,
            "context parallelism runs only with SDPA attention",
            "drop --use_flash_attn (or use --attn_implementation sdpa)",
        )
    if cfg.data.max_seq_len % (2 * p.cp_size):
        yield error(
            cfg,
            "FT048",
            "data.max_seq_len",
            f"max_seq_len {cfg.data.max_seq_len} must be divisible by 2 x cp_size = {2 * p.cp_size} "
            "(each rank takes two chunks of every sequence)",
            f"--max_seq_len {cfg.data.max_seq_len // (2 * p.cp_size) * 2 * p.cp_size}",
        )
    t = cfg.training
    metric = t.get("metric_for_best_model")
    if metric and metric not in ("loss", "eval_loss"):
        yield error(
            cfg,
            "FT048",
            "training.metric_for_best_model",
            f"metric {metric!r} needs predictions, but under context parallelism logits stay sharded "
            "along the sequence",
            "use eval_loss (the only metric computed under CP)",
        )
    if t.get("include_for_metrics") or t.is_set("prediction_loss_only") and not t.get("prediction_loss_only"):
        path = "training.include_for_metrics" if t.get("include_for_metrics") else "training.prediction_loss_only"
        yield error(
            cfg,
            "FT048",
            path,
            "predictions/compute_metrics are not available under context parallelism (logits stay sharded)",
            "remove it; evaluation reports eval_loss only",
        )
    if evaluation(cfg):
        yield finding(
            cfg,
            "FT048",
            Severity.NOTE,
            "training.eval_strategy",
            "under context parallelism evaluation reports eval_loss only",
        )


def cp_method(cfg: RunConfig) -> Iterator[Finding]:
    """The Trainer shards only input_ids, labels, shift_labels, a 2-D attention_mask and position_ids along the
    sequence (transformers trainer.py _prepare_context_parallel_inputs). SFT's loss is a sum over tokens, which the
    ranks' slices add up to; the preference methods' and the reward model's are per sequence (log-probabilities
    summed under a completion mask that is not sharded, a score read at the last token), which no rank's slice
    holds (the row's context_parallel). A generating method is refused by FT138."""
    method = cfg.run.method
    row = row_of(method)
    if not row.context_parallel and not row.generates:
        yield error(
            cfg,
            "FT048",
            "parallelism.cp_size",
            f"--method {method} scores whole sequences, and context parallelism gives each rank a slice of every "
            "sequence (the Trainer shards only input_ids, labels and position_ids): "
            f"only {', '.join(r.says for r in ROWS.values() if r.context_parallel)} trains under it",
            "--parallelism_config_cp_size 1, or --method " + next(n for n, r in ROWS.items() if r.context_parallel),
        )


def cp_packing(cfg: RunConfig) -> Iterator[Finding]:
    """Under context parallelism accelerate replaces every attention mask with plain causal attention
    (big_modeling.py _attach_context_parallel_hooks: SDPA's ring takes no mask) and the Trainer shards position_ids
    along with the tokens: packed rows, or padding-free batches of rows laid end to end, would let each document
    attend to the ones before it (TRL#6843)."""
    why = (
        "under context parallelism attention is plain causal over the whole row (the ring attention takes no mask), "
        "so documents {} would attend across their boundaries (TRL#6843)"
    )
    if cfg.data.packing:
        yield error(cfg, "FT048", "data.packing", why.format("packed into one row"), "drop --packing")
    elif cfg.training.get("eval_packing"):
        yield error(cfg, "FT048", "training.eval_packing", why.format("packed into one row"), "drop --eval_packing")
    elif cfg.training.get("padding_free"):
        message = why.format("laid end to end by padding_free")
        yield error(cfg, "FT048", "training.padding_free", message, "drop --padding_free")


@rule("FT035", "parallelism", "tensor parallelism with FSDP and LoRA")
def tp_with_lora(cfg: RunConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    if p.enabled and p.tp_size > 1:
        yield error(
            cfg,
            "FT035",
            "parallelism.tp_size",
            "tensor parallelism is not something accelerate applies: the model must be loaded tensor-parallel by "
            "transformers (DistributedConfig(tp_size)), and PEFT 0.21's LoRA on its row-parallel layers (o_proj, "
            "down_proj) fails in the first forward (peft/tuners/lora/layer.py:1102 through "
            "transformers/distributed/tensor_parallel.py:136: the adapter gets the rank's slice of the input; "
            "measured on CPU at transformers 5.24, tests/dist/test_expert_parallel.py)",
            "use HSDP (dp_replicate_size x dp_shard_size) or plain FSDP; set tp_size to 1",
        )


EP_SIZE = "parallelism.ep_size"
# transformers 5.24 and peft 0.21, found on 2 CPU ranks (scripts/ep_lora_experiment.py,
# tests/dist/test_expert_parallel.py)
EXPERTS_LORA_FAILS = (
    "PEFT's LoRA on the fused experts fails in the first forward under ep_size > 1 (\"aten.baddbmm.default got "
    'mixed torch.Tensor and DTensor", peft/tuners/lora/layer.py:2323): transformers makes each experts module an '
    "FSDP2 unit of its own on the expert mesh (transformers/distributed/fsdp.py:202), so its weights are still "
    "sharded DTensors when PEFT's ParamWrapper, which wraps that module, folds W + B@A into them "
    "(peft/tuners/lora/layer.py:2594) with plain-tensor factors sized for every expert"
)


def _experts(config: dict | None) -> int | None:
    text = (config or {}).get("text_config") if isinstance((config or {}).get("text_config"), dict) else config
    return next((text[k] for k in EXPERT_COUNT_KEYS if isinstance((text or {}).get(k), int)), None)


@rule("FT139", "parallelism", "expert parallelism (ep_size) against the world, the mesh and the model", decided=True)
def ep_size_fits(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    """long because it is DistributedConfig's checks in its order: the size, the mesh, the world, the model."""
    p, ep = cfg.parallelism, cfg.parallelism.ep_size
    if p.enabled and ep < 1:
        yield error(cfg, "FT139", EP_SIZE, f"ep_size must be at least 1, got {ep}", "use 1 or more")
    if expert_parallel_size(cfg) == 1:
        return
    others = [f"{k}={v}" for k, v in mesh_sizes(cfg).items() if k != "dp_shard_size" and v > 1]
    if others or cfg.fsdp.version != 2:
        combined = ", ".join(others) if others else "FSDP1"
        yield error(
            cfg,
            "FT139",
            EP_SIZE,
            f"ep_size={ep} with {combined}: fsdp-tune runs expert parallelism inside FSDP2's sharding dimension only "
            "(DistributedConfig(fsdp_size=world, ep_size)), the combination checked on CPU",
            "set the other parallelism sizes to 1 and fsdp_version 2",
        )
    shard = mesh_sizes(cfg)["dp_shard_size"]
    if shard % ep:
        yield error(
            cfg,
            "FT139",
            EP_SIZE,
            f"ep_size={ep} does not divide the {shard} ranks FSDP shards over (fsdp_size): transformers refuses it "
            "(distributed/configuration_utils.py: `ep_size` must divide `fsdp_size * tp_size`)",
            f"an ep_size that divides {shard}, e.g. {max(k for k in range(1, ep + 1) if shard % k == 0)}",
        )
    config = d.model.config
    if config is None:
        return
    experts = _experts(config)
    if not experts or experts < 2:
        yield error(
            cfg, "FT139", EP_SIZE, f"{config.get('model_type')} has no experts to split", "drop ep_size (or set 1)"
        )
    elif experts % ep:
        yield error(
            cfg,
            "FT139",
            EP_SIZE,
            f"{experts} experts cannot be split evenly over ep_size={ep} ranks (transformers refuses it: "
            "distributed/expert_parallel.py, 'Cannot evenly shard')",
            "an ep_size that divides the number of experts",
        )
    elif expert_parallel_plan(config) is False:
        yield error(
            cfg,
            "FT139",
            EP_SIZE,
            f"{config.get('model_type')}'s config class has no base_model_ep_plan: transformers refuses ep_size > 1 "
            "for it (distributed/mixin.py _resolve_parallel_plans)",
            "drop ep_size: plain FSDP2 shards each layer with all its experts",
        )


@rule("FT140", "parallelism", "LoRA on the experts under expert parallelism", decided=True)
def ep_lora_on_experts(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if expert_parallel_size(cfg) == 1 or not cfg.lora.use_peft_lora:
        return
    reach = param_targets(cfg, d.model.config)
    named = [t for t in (reach.explicit if reach else ()) if "experts" in t]
    if reach and (reach.experts or named):
        path = "peft.target_parameters" if named else "lora.lora_target_modules"
        shown = ", ".join(named or reach.experts)
        yield error(
            cfg,
            "FT140",
            path,
            f"LoRA would reach the experts ({shown}) at ep_size={cfg.parallelism.ep_size}: {EXPERTS_LORA_FAILS}",
            "target attention and the dense layers only (e.g. --lora_target_modules q_proj,k_proj,v_proj,o_proj), "
            "or drop ep_size to train the experts' LoRA under plain FSDP2",
        )


# what an expert-parallel run has not been run with: each a key, why, and the fix
EP_NOT_RUN = (
    ("lora.use_peft_lora", lambda c: not c.lora.use_peft_lora, "full fine-tuning", "--use_peft_lora true"),
    (
        "quantization.use_4bit_quantization",
        lambda c: c.quantization.use_4bit_quantization or c.quantization.use_8bit_quantization,
        "4-bit or 8-bit (bitsandbytes) weights",
        "drop the quantization flags",
    ),
    (
        "run.method",
        lambda c: not row_of(c.run.method).expert_parallel,
        f"a method other than {', '.join(n for n, r in ROWS.items() if r.expert_parallel)}",
        "--method " + ", ".join(n for n, r in ROWS.items() if r.expert_parallel),
    ),
    (
        "training.load_best_model_at_end",
        lambda c: bool(c.training.get("load_best_model_at_end")),
        "load_best_model_at_end (the best checkpoint's adapter is not loaded back onto a model sharded at load by "
        "fsdp-tune's checkpoint path, worker/training/trainer.py)",
        "drop load_best_model_at_end: the checkpoints are kept (pick one with --resume_from_checkpoint or export)",
    ),
)


@rule("FT141", "parallelism", "what an expert-parallel run cannot take")
def ep_not_run(cfg: RunConfig) -> Iterator[Finding]:
    if expert_parallel_size(cfg) == 1:
        return
    ep = cfg.parallelism.ep_size
    for path, applies, what, fix in EP_NOT_RUN:
        if applies(cfg):
            yield error(cfg, "FT141", path, f"ep_size={ep} with {what}: not run under expert parallelism", fix)
    f = cfg.fsdp
    for name, dropped, fix in (
        ("cpu_offload", f.cpu_offload, "drop fsdp_cpu_offload"),
        ("activation_checkpointing", f.activation_checkpointing, "--gradient_checkpointing true instead"),
        ("reshard_after_forward", not f.reshard_after_forward, "drop fsdp_reshard_after_forward (it reshards)"),
        (
            "state_dict_type",
            cfg.is_set("fsdp.state_dict_type") and cfg.training.get("save_strategy") != "no",
            "drop fsdp_state_dict_type: each checkpoint holds the whole replicated adapter, as the final save does",
        ),
    ):
        if dropped:
            yield warning(
                cfg,
                "FT141",
                f"fsdp.{name}",
                f"dropped at ep_size={ep}: transformers shards the model as it loads (DistributedConfig, its layers "
                "resharded after forward) and accelerate's FSDP plugin, which applies this setting, is off",
                fix,
            )
