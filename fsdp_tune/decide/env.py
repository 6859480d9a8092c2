"""The ranks' process group and environment, decided with the rest of the rank spec (rank.py): the backend, what
`accelerate launch` would export for the config's launch keys, and the secrets that travel in the environment
only. Pure."""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived
from fsdp_tune.decide.machine import Machine, needs_nccl_p2p_off


def backend(d: Derived) -> str:
    """gloo on CPU; NCCL on GPUs, with gloo beside it for the CPU tensors cpu_offload leaves (gradient
    clipping all-reduces the offloaded gradients' norms on the CPU), as accelerate does (state.py)."""
    if d.on_cpu:
        return "gloo"
    return "cuda:nccl,cpu:gloo" if d.offload else "nccl"


def secret_env(cfg: RunConfig) -> dict[str, str]:
    """Secrets the ranks need, passed in their environment only (never in the rank spec, a file): --hub_token
    as HF_TOKEN, which the Trainer's and fsdp-tune's pushes read when hub_token is unset (huggingface_hub's
    get_token)."""
    token = cfg.training.get("hub_token")
    return {"HF_TOKEN": str(token)} if token else {}


def rank_env(cfg: RunConfig, machine: Machine, on_cpu: bool, accelerate_fsdp: bool = True) -> dict[str, str]:
    """The ranks' environment: what accelerate launch exports for the config's launch keys
    (accelerate/utils/launch.py), so the ranks' Accelerator behaves the same, and fsdp-tune's own. Without
    accelerate's FSDP (`accelerate_fsdp` False: a model transformers shards at load, expert parallelism) it is
    switched off by name, so that one inherited from a shell or an `accelerate launch` does not turn it on: accelerate
    refuses such a model under an FSDP config (parallelism_config.py:381), and its Trainer never creates the
    optimizer then."""
    lc = cfg.launch
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["ACCELERATE_USE_FSDP"] = str(accelerate_fsdp).lower()
    if accelerate_fsdp:
        env["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(cfg.fsdp.cpu_ram_efficient_loading).lower()
    if machine.omp_num_threads is None and cfg.launch.nproc_per_node > 1:
        # what torchrun sets then (torch/distributed/run.py), said here so it prints no banner about it
        env["OMP_NUM_THREADS"] = "1"
    if not on_cpu and needs_nccl_p2p_off(machine):
        env.update(NCCL_P2P_DISABLE="1", NCCL_IB_DISABLE="1")  # what `accelerate launch` sets on such hosts
    if on_cpu and machine.cuda:
        # a CPU run on a machine with GPUs: fully_shard would put the shards on the default accelerator
        # under a gloo group; the ranks must not see the GPUs at all
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif lc.gpu_ids and lc.gpu_ids != "all" and not on_cpu:
        env["CUDA_VISIBLE_DEVICES"] = lc.gpu_ids
    if cfg.fsdp.activation_checkpointing_offload and not on_cpu:
        # accelerate's plugin reads it from the environment (Transformers' fsdp_config does not carry it)
        env["FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"] = "true"
    if lc.enable_cpu_affinity:
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    if lc.accelerate_debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if lc.dynamo_backend.lower() != "no":
        env.update(
            ACCELERATE_DYNAMO_BACKEND=lc.dynamo_backend.upper(),
            ACCELERATE_DYNAMO_MODE=lc.dynamo_mode,
            ACCELERATE_DYNAMO_USE_FULLGRAPH=str(lc.dynamo_use_fullgraph),
            ACCELERATE_DYNAMO_USE_DYNAMIC=str(lc.dynamo_use_dynamic),
            ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=str(lc.dynamo_use_regional_compilation),
        )
    return env
