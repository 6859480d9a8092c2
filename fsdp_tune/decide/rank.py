"""decide(): the typed RunConfig and this Machine -> the RankSpec every rank executes.

Each decision is made here once (litgpt's `setup()` decides, `main(fabric)` executes): the device and the
process-group backend, every dtype, gradient vs activation checkpointing, the exact `fsdp_config` and
SFTConfig arguments Transformers receives (decide/trainer.py), and the ranks' environment. Pure: no torch, no files
written.
"""

from __future__ import annotations

import os

from fsdp_tune.config.run_folder import output_dir as run_output_dir
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide import vision
from fsdp_tune.decide.data import data_spec
from fsdp_tune.decide.datafiles import Look
from fsdp_tune.decide.derived import Derived, derive, mesh_active, mesh_sizes
from fsdp_tune.decide.env import backend, rank_env
from fsdp_tune.decide.loading import decide_loading, trainer_fsdp_config_for
from fsdp_tune.decide.lora import lora_spec
from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.method import GenerationWeights, generation_spec, method_spec, steps
from fsdp_tune.decide.spec import Mesh, MixedPrecision, ModelSpec, Quantization, RankSpec, SaveSpec, World
from fsdp_tune.decide.trainer import fsdp_config, trainer_args
from fsdp_tune.sources.builtin import target as builtin_folder
from fsdp_tune.sources.classes import chosen_attention

BUILTIN = "builtin:"  # a model fsdp-tune builds: the ranks read the folder it is built into (launch/torchrun.py)
DEFAULT_TIMEOUT_S = 1800  # TrainingArguments' ddp_timeout default


def console_mode(verbose: bool, tty: bool) -> str:
    """What rank 0 shows (RankSpec.console). The ranks write to the launcher's stdout (torchrun passes it on),
    so whether that is a terminal is known here."""
    return "verbose" if verbose else "live" if tty else "lines"


def decide(
    cfg: RunConfig,
    machine: Machine,
    resume: str | None = None,
    console: str = "lines",
    *,
    files: tuple[Look, ...] | None = None,
    generation: GenerationWeights | None = None,
) -> RankSpec:
    """The rank spec, whole: nothing writes into it afterwards. `files`: the data files read once (decide/data.py
    read_files), which the data pre-flight then checks; None for a spec that does not read them (`plan`, `--emit`).
    `generation`: a generating method's generation weights as the launcher's memory plan decided them
    (preflight/memory.py plan_generation), an input made before this call."""
    d = derive(cfg, machine)  # decide/derived.py, once: every decision below reads it
    on_cpu = d.on_cpu
    output_dir = run_output_dir(cfg)  # config/run_folder.py: the one answer
    qlora_policy = fsdp2_qlora_policy(cfg, d)
    units = fsdp_config(cfg, d)  # the transformers path's fsdp_config (decide/trainer.py)
    loading = decide_loading(cfg, d, units, qlora_policy)  # decide/loading.py
    sharded_at_load = loading.distributed_config is not None  # accelerate's FSDP off: transformers sharded it
    args = trainer_args(cfg, d, output_dir, trainer_fsdp_config_for(loading, units), not sharded_at_load)
    return RankSpec(
        world=world(cfg),
        device="cpu" if on_cpu else "cuda",
        backend=backend(d),
        timeout_s=int(cfg.training.get("ddp_timeout") or DEFAULT_TIMEOUT_S),
        env=rank_env(cfg, machine, on_cpu, accelerate_fsdp=not sharded_at_load),
        cpu_fsdp_shim=on_cpu,
        trainer_args=args,
        parallelism=None if sharded_at_load else mesh(cfg, on_cpu),
        fsdp_mixed_precision=qlora_policy,
        model=model_spec(cfg, d),
        lora=lora_spec(cfg, d.model),
        data=data_spec(cfg, d, files),
        resume_from_checkpoint=resume,
        checkpoint_on_stop=cfg.training.get("save_strategy") != "no" and cfg.run.save_on_interrupt,
        check_grad_norm=d.precision != "fp16",  # fp16's scaler skips steps with inf gradients by design
        loading=loading,
        evaluation=d.evaluation,
        seed=d.seed,
        full_state_dict=cfg.fsdp.state_dict_type == "FULL_STATE_DICT",
        notes=_notes(cfg, d),
        console=console,
        save=save_spec(cfg),
        method=method_spec(cfg),
        steps=steps(cfg),
        generating=generation_spec(cfg, cfg.launch.num_processes, generation),
    )


def save_spec(cfg: RunConfig) -> SaveSpec:
    """FSDP2 gathers the adapter alone and reloads each rank's rows in place; FSDP1's flat parameters go unit by
    unit (torch's full state dict would gather the whole model, and clone it on the GPU for an unsharded unit).
    A FULL_STATE_DICT checkpoint of an adapter is that same adapter file: accelerate's save_fsdp_model, which the
    Trainer calls beside it, would take FSDP1's full state dict of the whole model (accelerate 1.15
    utils/fsdp_utils.py: get_peft_model_state_dict -> model.state_dict() inside FULL_STATE_DICT; measured on CPU with
    FSDP1 NO_SHARD in one process, tests/lib/test_fsdp1_units_on_cpu.py)."""
    adapter_file = cfg.fsdp.state_dict_type == "FULL_STATE_DICT" and cfg.lora.use_peft_lora
    checkpoint = "adapter_file" if adapter_file else "accelerate"
    if cfg.fsdp.version == 1:
        return SaveSpec(final="fsdp1_units", resume="fsdp1_units", checkpoint=checkpoint)
    return SaveSpec(final="gather_trainable", resume="local_rows", checkpoint=checkpoint)


def world(cfg: RunConfig) -> World:
    lc = cfg.launch
    single = lc.num_machines == 1
    return World(
        world_size=lc.num_processes,
        nnodes=lc.num_machines,
        nproc_per_node=lc.nproc_per_node,
        node_rank=lc.machine_rank,
        master_addr=lc.main_process_ip or "127.0.0.1",
        master_port=lc.main_process_port,
        rdzv_backend=lc.rdzv_backend,
        # one machine and no port asked for: let torchrun pick a free port (two runs can share a host)
        standalone=single and not cfg.is_set("launch.main_process_port"),
        max_restarts=lc.max_restarts,
    )


def mesh(cfg: RunConfig, on_cpu: bool = False) -> Mesh | None:
    """accelerate's ParallelismConfig for the run (the device mesh), or None for plain FSDP over all ranks.

    The sizes are the ones the rules checked against the world size (FT044); dp_shard_size left unset
    takes what the other dimensions leave, as accelerate does. A CPU run always gets an explicit mesh: without
    one, fully_shard builds its default mesh on the accelerator torch was *built* for, so on a CUDA build the
    "CPU" run would all-gather on the GPUs (or fail where they are hidden); accelerate builds a given mesh on
    its own device, the CPU (accelerator.py get_device_mesh)."""
    p = cfg.parallelism
    world = max(cfg.launch.num_processes, 1)
    if not mesh_active(cfg):
        if on_cpu and world > 1:
            return Mesh(dp_replicate_size=1, tp_size=1, cp_size=1, dp_shard_size=world)
        return None  # only dp_shard: exactly what plain FSDP does
    sizes = mesh_sizes(cfg)
    return Mesh(
        dp_replicate_size=sizes["dp_replicate_size"],
        tp_size=sizes["tp_size"],
        cp_size=sizes["cp_size"],
        dp_shard_size=sizes["dp_shard_size"],
        cp_comm_strategy=p.cp_comm_strategy if p.cp_size > 1 else None,
    )


def fsdp2_qlora_policy(cfg: RunConfig, d: Derived) -> MixedPrecision | None:
    """FSDP2's MixedPrecisionPolicy for QLoRA: every dtype the 4-bit storage dtype.

    FSDP2 casts every floating parameter to the policy's param_dtype when it all-gathers, packed 4-bit weights
    included: with the run's precision there (what accelerate sets) fp32 storage crashes bitsandbytes'
    dequantize and fp16/bf16 storage under the other half precision corrupts the weights silently.
    transformers sets the storage dtype only on its FSDP1 path (update_fsdp_plugin_peft, called only when the
    optimizer is created late, which FSDP2 forbids): fsdp-tune decides it here for FSDP2."""
    if cfg.fsdp.version != 2 or not cfg.quantization.use_4bit_quantization:
        return None
    return MixedPrecision.every(d.quant_storage)


def attention(cfg: RunConfig, d: Derived) -> str | None:
    """The user's, else the model class's default (sdpa, or eager where the class cannot take sdpa); None for a
    model not on this machine: transformers then picks the same way when it loads it."""
    m = cfg.model
    return chosen_attention(d.model.config, m.attn_implementation, m.use_flash_attn)


def model_spec(cfg: RunConfig, d: Derived) -> ModelSpec:
    q = cfg.quantization
    quantization = None
    if q.use_4bit_quantization:
        quantization = Quantization(
            bnb_4bit_quant_type=q.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=q.bnb_4bit_compute_dtype,
            bnb_4bit_use_double_quant=q.use_nested_quant,
            bnb_4bit_quant_storage=d.quant_storage,
        )
    name = cfg.model.model_name_or_path or ""
    template = cfg.data.chat_template_format
    return ModelSpec(
        name_or_path=str(builtin_folder(name.removeprefix(BUILTIN))) if name.startswith(BUILTIN) else name,
        requested=name,
        revision=cfg.model.model_revision,
        dtype=d.model_dtype,
        attn_implementation=attention(cfg, d),
        trust_remote_code=cfg.model.trust_remote_code,
        quantization=quantization,
        chat_template=None if template == "none" else template,
        adapter=os.path.abspath(os.path.expanduser(cfg.model.adapter)) if cfg.model.adapter else None,
        reference=cfg.model.reference if cfg.model.adapter else "base",
        kind=vision.model_kind(d.model),  # config/model_kinds.py: the Auto class, a processor or not
        vision=vision.vision_spec(cfg, d.model),
        facts=d.model,
    )


def _notes(cfg: RunConfig, d: Derived) -> tuple[str, ...]:
    notes = []
    # offload on a CPU run is FT031's (rules/fsdp.py, on the machine it launches on too), not a note here
    return tuple(notes)
