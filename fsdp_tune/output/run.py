"""The launch plan `train` prints before starting, and the summary it prints at the end."""

from __future__ import annotations

from fsdp_tune.config.methods import metric_keys, row_of
from fsdp_tune.config.model_kinds import FAMILIES, KINDS
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide import loading
from fsdp_tune.decide.datafiles import Counted
from fsdp_tune.decide.spec import DistributedSizes, RankSpec
from fsdp_tune.output.data import plan_lines, summary_lines
from fsdp_tune.output.findings import show
from fsdp_tune.summary import RunSummary


def format_summary(s: RunSummary) -> str:
    """The few lines a user reads after a run."""
    loss = (
        f"{s.loss_first:.3f} -> {s.loss_last:.3f}"
        if s.loss_first is not None and s.loss_last is not None
        else "not logged (logging_steps > steps)"
    )
    lines = [_done(s, loss), *method_summary(s)]
    ranks = ", ".join(f"rank {i}: {r.peak_rss_mib:.0f} MiB" for i, r in enumerate(s.per_rank))
    units = ", ".join(f"{n} x {k}" for k, n in s.fsdp_units.items())
    lines += [f"  peak memory (RSS): {ranks}", f"  FSDP units: {units or '-'}"]
    if s.mesh:
        # accelerate shards over the flattened dp_shard x cp dim, named dp_shard_cp, whatever cp is
        flat = " (dp_shard x cp, as accelerate names it)" if "dp_shard_cp" in s.mesh else ""
        lines.append(
            "  device mesh (read from the trained weights): " + " x ".join(f"{k} {v}" for k, v in s.mesh.items()) + flat
        )
    checked = (s.extra or {}).get("self_check")
    if checked:
        lines.append(
            f"  self-check after step 1: {checked['sharded']} trainable tensors sharded over the ranks, "
            f"{checked['whole']} whole and identical on every rank, gradients reduced"
            + (f"; {checked['experts']} expert tensors each rank's own" if checked.get("experts") else "")
        )
    grew = s.vocab_grew
    if grew:
        lines.append(
            f"  vocabulary: {grew['from']} -> {grew['tokenizer']} tokens (the chat template's); the adapter carries "
            f"the embedding layers ({grew['rows']} rows): load it onto a base resized with "
            "resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8) (fsdp-tune merge does)"
        )
    cut = s.truncated_sequences or {}
    if cut.get("cut"):
        lines.append(f"  data: {cut['cut']} of {cut['total']} sequences were cut at max_seq_len {cut['max_seq_len']}")
    if cut.get("dropped"):
        lines.append(
            f"  data: the trainer left out {cut['dropped']} rows that do not fit max_seq_len {cut['max_seq_len']}"
        )
    lines += summary_lines(s.data)
    gpu = [r for r in s.per_rank if r.peak_gpu_reserved_mib is not None]
    if gpu:
        lines.append("  peak GPU reserved: " + ", ".join(f"{r.peak_gpu_reserved_mib:.0f} MiB" for r in gpu))
    for tracker, where in (s.trackers or {}).items():
        lines.append(f"  {tracker}: {where}")
    if s.adapter_check:
        lines.append(f"  adapter: {s.adapter_dir} ({s.adapter_check['lora_tensors']} LoRA tensors, whole, trained)")
    else:
        lines.append(f"  saved to: {s.adapter_dir}")
    return "\n".join(lines)


def _done(s: RunSummary, loss: str) -> str:
    tokens = f", {s.tokens_per_s:.0f} tokens/s" if s.tokens_per_s else ""
    return f"done: {s.steps} steps in {s.train_runtime_s:.1f} s, loss {loss}{tokens}"


def method_summary(s: RunSummary) -> list[str]:
    """The method's own metrics, first and last logged (DPO: reward accuracy 0.50 -> 1.00, ...)."""
    if not s.method_metrics:
        return []
    shown = [
        f"{label} {s.method_metrics[key]['first']:.3g} -> {s.method_metrics[key]['last']:.3g}"
        for key, label in metric_keys(row_of(s.method), s.method_metrics)
    ]
    return [f"  {s.method}: " + ", ".join(shown)]


def _expert_mesh(sizes: DistributedSizes) -> str:
    """The fsdp line of an expert-parallel run: transformers' meshes, not accelerate's plugin."""
    fsdp, ep = sizes.fsdp_size, sizes.ep_size
    return (
        f"  fsdp: FSDP2 by transformers at load (DistributedConfig), device mesh fsdp {fsdp}; experts: ep {ep} x "
        f"efsdp {fsdp // ep} (each rank 1/{ep} of every layer's experts, tokens exchanged by all-to-all)"
    )


# what a checkpoint of a model sharded at load holds (worker/saving/replicated.py)
SAVED_AT_LOAD = (
    "  checkpoints: the replicated adapter (rank 0's), the optimizer and scheduler, each rank's RNG; "
    "final adapter: whole"
)


def describe_launch(cfg: RunConfig, spec: RankSpec, command: list[str], counted: tuple[Counted, ...] = ()) -> str:
    """The plan `train` prints before launching (and `--dry_run` alone): what every rank will execute, and what the
    data pre-flight counted beside it (`counted`: rows tokenized, images)."""
    w, f = spec.world, spec.unit_fsdp_config  # under sharded loading fsdp-tune makes the units accelerate would
    wrap = f.auto_wrap_policy + (
        f" ({','.join(f.transformer_layer_cls_to_wrap)})"
        if f.transformer_layer_cls_to_wrap
        else " (the model's decoder layers)"
        if f.auto_wrap_policy == "TRANSFORMER_BASED_WRAP"
        else ""
    )
    lines = [
        f"plan: {w.world_size} rank{'s' if w.world_size > 1 else ''} on {w.nnodes} machine"
        f"{'s' if w.nnodes > 1 else ''} ({w.nproc_per_node} per machine, this is machine {w.node_rank}), "
        f"{spec.device.upper() if spec.device == 'cpu' else 'GPU'}, {spec.backend}",
        *method_lines(spec),
        "  torchrun: " + " ".join(command),
        f"  fsdp: FSDP{spec.fsdp_version}, reshard_after_forward={show(f.reshard_after_forward)}, "
        f"cpu_offload={show(f.cpu_offload)}, wrap {wrap}",
    ]
    if spec.parallelism:
        sizes = {k.removesuffix("_size"): v for k, v in spec.parallelism.sizes().items() if v > 1}
        lines.append("  device mesh: " + " x ".join(f"{k} {v}" for k, v in sizes.items()))
    saved = f"  checkpoints: {f.state_dict_type}; final adapter: full state dict, loadable without FSDP"
    if spec.loading.distributed_config:
        lines[-1] = _expert_mesh(spec.loading.distributed_config)
        saved = SAVED_AT_LOAD
    lines += [
        saved,
        f"  precision: {spec.precision}, model loaded in {spec.model.dtype}, "
        f"attention {spec.model.attn_implementation or 'as transformers picks (sdpa, else eager)'}; "
        f"checkpointing: {_CHECKPOINTING[spec.checkpointing]}",
    ]
    if spec.lora:
        lo = spec.lora
        targets = lo.target_modules if isinstance(lo.target_modules, str) else ",".join(lo.target_modules)
        lines.append(
            f"  {'DoRA' if lo.use_dora else 'LoRA'}: r={lo.r} alpha={lo.lora_alpha:g} "
            f"dropout={lo.lora_dropout:g} targets={targets}"
        )
    q = spec.model.quantization
    if q:
        lines.append(
            f"  QLoRA: 4-bit {q.bnb_4bit_quant_type}, storage {q.bnb_4bit_quant_storage}, compute "
            f"{q.bnb_4bit_compute_dtype}, nested={show(q.bnb_4bit_use_double_quant)}"
        )
    lines += vision_lines(spec, counted)
    d = spec.data
    lines.append(f"  model: {cfg.model.model_name_or_path}   data: {d.dataset_name} (splits {','.join(d.splits)})")
    lines += plan_lines(d, d.packing_strategy, counted)
    lines.append(f"  loading: {loading.describe(spec.loading)}")
    lines.append("  rank env: " + " ".join(f"{k}={v}" for k, v in spec.env.items()))
    lines.append(
        f"  output: {spec.output_dir}"
        + (f"   resume: {spec.resume_from_checkpoint}" if spec.resume_from_checkpoint else "")
    )
    lines += [f"  note: {n}" for n in spec.notes]
    return "\n".join(lines)


def method_lines(spec: RankSpec) -> list[str]:
    """The training method (none for SFT, the default), and for DPO/KTO what the policy is compared with; a
    starting adapter."""
    m = spec.model
    name = spec.method.name
    lines = [f"  method: {row_of(name).title}"] if row_of(name).named else []
    if spec.method.reference_adapter and spec.generating is None:  # GRPO's says what its reference is (grpo_lines)
        ref = "a frozen copy of the starting adapter" if m.reference == "adapter" else "the base model"
        how = 'a frozen "ref" adapter inside FSDP\'s units' if spec.loading.path == "sharded" else "TRL's"
        lines.append(f"  reference: {ref} ({how}; no grad, nothing saved for backward)")
    if spec.generating is not None:
        lines += grpo_lines(spec)
    if m.adapter:
        lines.append(f"  start: the adapter in {m.adapter} (its LoRA shape, its weights)")
    return lines


def vision_lines(spec: RankSpec, counted: tuple[Counted, ...] = ()) -> list[str]:
    """A vision-language model's plan: what trains, the guard, and the images pre-flight found."""
    v = spec.model.vision
    if v is None:
        return []
    family = FAMILIES[v.family]
    parts = [
        f"vision tower ({v.tower}) " + ("trains (LoRA)" if v.train_tower else "frozen"),
        f"projector ({v.projector}) " + ("trains whole" if v.train_projector else "frozen"),
    ]
    guard = "a batch without images gets a dummy image: every rank runs the vision tower each step"
    title = family.title + ("" if family.tested else " (its row is by reading: no test of fsdp-tune trains it)")
    lines = [f"  vision: {title}, {KINDS[spec.model.kind].title}; {', '.join(parts)}; {guard}"]
    for s, c in zip(spec.data.sources, counted, strict=False):
        if c.images and c.images.get("image_rows"):
            w, h = c.images["largest"]
            lines.append(
                f"  images: {s.label}: {c.images['image_rows']} rows with images, {c.images['text_rows']} text-only; "
                f"largest {w}x{h}"
            )
    return lines


_REFERENCE = {
    "off": "none (beta 0: no KL term)",
    "adapter_disabled": "the base: the same sharded model with the adapter switched off (no grad)",
    "ref_adapter": "a frozen copy of the policy's start adapter (a \"ref\" adapter inside FSDP's units; no grad)",
}


def grpo_lines(spec: RankSpec) -> list[str]:
    """GRPO's rewards, how it generates, what its KL term compares with."""
    g, t = spec.generating, spec.trainer_args.kwargs()
    rewards = ", ".join(f"{r.written} ({r.kind.replace('_', ' ')})" for r in g.rewards)
    weights = t.get("reward_weights")
    lines = [f"  rewards: {rewards}" + (f", weights {' '.join(f'{w:g}' for w in weights)}" if weights else "")]
    n, length = g.num_generations, g.max_completion_length
    if g.generation == "vllm":
        how = f"vLLM ({t.get('vllm_mode', 'colocate')}), the adapter alone synced after each step (by reading: not run)"
    else:
        stepping = ", every rank stepping until all finish" if g.synced else ""
        weights = {"gathered": "the policy gathered once per generation", "sharded": "the sharded policy"}
        how = f"transformers' generate on {weights.get(g.weights, g.weights)}{stepping} ({g.weights_why})"
    lines.append(f"  generation: {n} completions a prompt, up to {length} tokens, {how}")
    lines.append(f"  reference: {_REFERENCE[g.reference]}")
    return lines


_CHECKPOINTING = {
    "fsdp": "FSDP activation checkpointing",
    "gradient": "the Trainer's gradient checkpointing",
    "off": "off",
}
