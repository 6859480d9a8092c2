"""The hand-off, walked: every field of the rank spec (and of the typed parts inside it) is read by the ranks,
run under torchrun's command line, or shown by the plan, as the table below says and the named code shows; and
the worker reads nothing but the spec: no environment decision beyond torchrun's own variables (and the
test-only fault hooks), no config re-read, no launcher decision imported.

A field added to the spec without a row here fails test_every_field_has_a_reader; a row whose module no longer
reads the field fails test_each_reader_reads_its_field.
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.spec import (
    DataSpec,
    DistributedSizes,
    FsdpConfig,
    GenerationSpec,
    Loading,
    LoraSpec,
    Mesh,
    MethodSpec,
    MixedPrecision,
    ModelSpec,
    Quantization,
    RankSpec,
    RewardSpec,
    SaveSpec,
    ShardedPlan,
    Steps,
    TrainerArgs,
    VisionSpec,
    World,
    from_dict,
)
from fsdp_tune.sources.mixture import Source
from tests.conftest import REPO, spec_for

PACKAGE = REPO / "fsdp_tune"
RANK, TORCHRUN, PLAN, AFTER = "read by the ranks", "torchrun's command line", "shown by the plan", "after the run"
PREFLIGHT = "pre-flight, before any rank starts"
LORA_SPEC = "config/lora_fields.py"  # LoraSpec sits below the rank spec: a finished run's record is read through it
PLAN_TEXT = "output/run.py"  # describe_launch: what `train` and `train --dry_run` print

# field -> (how, the module that reads or shows it); "the ranks" means code the worker runs
READERS: dict[type, dict[str, tuple[str, str]]] = {
    RankSpec: {
        "world": (RANK, "worker/recipe.py"),
        "device": (RANK, "worker/process.py"),
        "backend": (RANK, "worker/process.py"),
        "timeout_s": (RANK, "worker/process.py"),
        "env": (RANK, "worker/process.py"),
        "cpu_fsdp_shim": (RANK, "worker/process.py"),
        "trainer_args": (RANK, "decide/spec.py"),  # RankSpec.trainer_args_on, the worker's config (worker/recipe.py)
        "parallelism": (RANK, "worker/training/config.py"),
        "fsdp_mixed_precision": (RANK, "worker/training/config.py"),
        "model": (RANK, "worker/recipe.py"),
        "lora": (RANK, "worker/loading/adapter.py"),
        "data": (RANK, "worker/recipe.py"),
        "resume_from_checkpoint": (RANK, "worker/recipe.py"),
        "checkpoint_on_stop": (RANK, "worker/recipe.py"),
        "check_grad_norm": (RANK, "worker/recipe.py"),
        "loading": (RANK, "worker/loading/build.py"),
        "evaluation": (RANK, "worker/recipe.py"),
        "seed": (RANK, "worker/recipe.py"),
        "full_state_dict": (RANK, "worker/recipe.py"),
        "method": (RANK, "worker/training/methods.py"),
        "spec_version": (RANK, "decide/spec.py"),  # from_dict, as the worker reads the spec
        "notes": (PLAN, PLAN_TEXT),
        "console": (RANK, "worker/process.py"),
        "save": (RANK, "worker/recipe.py"),
        "steps": (PREFLIGHT, "preflight/batch.py"),  # the ranks' Trainer reads trainer_args; the trace reads it too
        "generating": (RANK, "worker/training/generating.py"),
    },
    GenerationSpec: {
        "rewards": (RANK, "worker/training/rewards.py"),
        "generation": (RANK, "worker/training/generating.py"),
        "synced": (RANK, "worker/training/generating.py"),
        "weights": (RANK, "worker/training/generating.py"),  # gathered once per generation, or sharded (generation.py)
        "weights_why": (PLAN, PLAN_TEXT),  # the launcher's reason, shown by --dry_run
        "weight_sync": (RANK, "worker/training/generating.py"),
        "reference": (RANK, "worker/training/generating.py"),
        "max_prompt_tokens": (RANK, "worker/data/prompts.py"),
        "num_generations": (PLAN, PLAN_TEXT),  # the ranks' GRPOConfig reads trainer_args'
        "max_completion_length": (RANK, "worker/training/rewards.py"),  # the length rewards' scale
    },
    RewardSpec: {
        "name": (RANK, "worker/training/rewards.py"),
        "kind": (RANK, "worker/training/rewards.py"),
        "target": (RANK, "worker/training/rewards.py"),
        "written": (RANK, "worker/training/rewards.py"),
        "attr": (RANK, "rewards/load.py"),
        "search_path": (RANK, "rewards/load.py"),
    },
    MethodSpec: {
        "name": (RANK, "worker/training/methods.py"),  # the ranks' hook: TRL's classes and the data preparation
        "data": (RANK, "worker/data/preference.py"),  # KTO's unpaired rows
        "head": (RANK, "worker/loading/pretrained.py"),  # a score head: AutoModelForSequenceClassification
        "reference_adapter": (RANK, "worker/loading/sharded.py"),
        "truncation": (RANK, "worker/data/lengths.py"),
    },
    Steps: {
        "per_device_train_batch_size": (PREFLIGHT, "preflight/batch.py"),  # a resume's batch (PF063), PF064
        "gradient_accumulation_steps": (PREFLIGHT, "preflight/batch.py"),
        "max_steps": (PREFLIGHT, "preflight/disk.py"),  # how many checkpoints the run keeps (PF037)
        "max_grad_norm": (PREFLIGHT, "trace/run.py"),  # plan --trace's step, before any rank
        "optim": (PREFLIGHT, "trace/run.py"),
        "save_strategy": (PREFLIGHT, "preflight/disk.py"),
        "save_steps": (PREFLIGHT, "preflight/disk.py"),
        "save_total_limit": (PREFLIGHT, "preflight/disk.py"),
    },
    SaveSpec: {
        "final": (RANK, "worker/recipe.py"),  # into training/trainer.py's Saving and saving/save.py
        "resume": (RANK, "worker/recipe.py"),
        "checkpoint": (RANK, "worker/recipe.py"),
    },
    World: {
        "world_size": (RANK, "worker/recipe.py"),
        "nnodes": (TORCHRUN, "launch/torchrun.py"),
        "nproc_per_node": (TORCHRUN, "launch/torchrun.py"),
        "node_rank": (TORCHRUN, "launch/torchrun.py"),
        "master_addr": (TORCHRUN, "launch/torchrun.py"),
        "master_port": (TORCHRUN, "launch/torchrun.py"),
        "rdzv_backend": (TORCHRUN, "launch/torchrun.py"),
        "standalone": (TORCHRUN, "launch/torchrun.py"),
        "max_restarts": (TORCHRUN, "launch/torchrun.py"),
    },
    LoraSpec: {  # LoraConfig's arguments by name (LoraSpec.kwargs; worker/loading/adapter.py builds LoraConfig)
        "r": (RANK, LORA_SPEC),
        "lora_alpha": (RANK, LORA_SPEC),
        "lora_dropout": (RANK, LORA_SPEC),
        "target_modules": (RANK, LORA_SPEC),
        "use_dora": (RANK, LORA_SPEC),
        "task_type": (RANK, LORA_SPEC),
        "bias": (RANK, LORA_SPEC),
        "revision": (RANK, LORA_SPEC),
        "exclude_modules": (RANK, LORA_SPEC),
        "modules_to_save": (RANK, LORA_SPEC),
        "peft_args": (RANK, LORA_SPEC),
    },
    Mesh: {  # ParallelismConfig's arguments, each by name (worker/training/config.py parallelism_config)
        "dp_replicate_size": (RANK, "worker/training/config.py"),
        "tp_size": (RANK, "worker/training/config.py"),
        "cp_size": (RANK, "worker/training/config.py"),
        "dp_shard_size": (RANK, "worker/training/config.py"),
        "cp_comm_strategy": (RANK, "worker/training/config.py"),
    },
    MixedPrecision: {  # MixedPrecisionPolicy's arguments by name (MixedPrecision.kwargs; both ranks' policies)
        "param_dtype": (RANK, "decide/spec.py"),
        "reduce_dtype": (RANK, "decide/spec.py"),
        "output_dtype": (RANK, "decide/spec.py"),
    },
    Quantization: {  # BitsAndBytesConfig's arguments, each by name (worker/loading/pretrained.py quantization_config)
        "bnb_4bit_quant_type": (RANK, "worker/loading/pretrained.py"),
        "bnb_4bit_compute_dtype": (RANK, "worker/loading/pretrained.py"),
        "bnb_4bit_use_double_quant": (RANK, "worker/loading/pretrained.py"),
        "bnb_4bit_quant_storage": (RANK, "worker/loading/pretrained.py"),
        "load_in_4bit": (RANK, "worker/loading/pretrained.py"),
    },
    ModelSpec: {
        "name_or_path": (RANK, "worker/loading/pretrained.py"),
        "requested": (AFTER, "tools/chat.py"),  # the model as the user named it (builtin:...), for chat and disk
        "dtype": (RANK, "worker/loading/pretrained.py"),
        "attn_implementation": (RANK, "worker/loading/pretrained.py"),
        "trust_remote_code": (RANK, "worker/loading/pretrained.py"),
        "quantization": (RANK, "worker/loading/pretrained.py"),
        "chat_template": (RANK, "worker/loading/tokenizer.py"),
        "revision": (RANK, "worker/loading/pretrained.py"),
        "adapter": (RANK, "worker/loading/build.py"),  # the starting adapter (sharded.py loads it there too)
        "reference": (RANK, "worker/recipe.py"),  # --reference base: the reference adapter reset to the base
        "kind": (RANK, "worker/loading/pretrained.py"),  # the Auto class (and a processor: loading/processor.py)
        "vision": (RANK, "worker/loading/pretrained.py"),  # freeze_vision; the collator reads its guard
        "facts": (PREFLIGHT, "preflight/disk.py"),  # the model door's find (the trace and preflight/vision.py too)
    },
    VisionSpec: {
        "family": (PLAN, PLAN_TEXT),  # the row's title on the plan's vision line
        "tower": (RANK, "worker/loading/pretrained.py"),  # full fine-tuning: frozen unless it trains
        "projector": (RANK, "worker/loading/pretrained.py"),
        "train_tower": (RANK, "worker/loading/pretrained.py"),  # under LoRA: the adapter's targets (decide/vision.py)
        "train_projector": (RANK, "worker/loading/pretrained.py"),
        "guard": (RANK, "worker/data/vision_collate.py"),
    },
    DataSpec: {
        "dataset_name": (PLAN, PLAN_TEXT),  # the ranks read the sources
        "splits": (PLAN, PLAN_TEXT),
        "text_field": (RANK, "worker/data/prepare.py"),
        "max_seq_len": (RANK, "sources/encode.py"),
        "packing": (RANK, "sources/encode.py"),
        "seed": (RANK, "worker/data/mixing.py"),
        "sources": (RANK, "worker/data/prepare.py"),
        "test_split_size": (RANK, "worker/data/mixing.py"),
        "mask_fallback": (RANK, "sources/encode.py"),
        "peft_text_field": (RANK, "worker/data/prepare.py"),
        "truncation_mode": (RANK, "sources/encode.py"),
        "packing_strategy": (RANK, "sources/encode.py"),
        "eos_token": (RANK, "sources/encode.py"),
        "num_proc": (RANK, "worker/data/prepare.py"),
        "pad_to_multiple_of": (RANK, "worker/data/vision_collate.py"),  # text batches: SFTConfig's, trainer_args'
    },
    Source: {
        "path": (RANK, "worker/data/splits.py"),
        "split": (RANK, "worker/data/prepare.py"),
        "eval_split": (RANK, "worker/data/prepare.py"),
        "name": (RANK, "worker/data/splits.py"),
        "data_dir": (RANK, "worker/data/splits.py"),
        "data_files": (RANK, "worker/data/splits.py"),
        "columns": (RANK, "worker/data/splits.py"),
        "column_map": (RANK, "worker/data/splits.py"),
        "roles": (RANK, "sources/rows.py"),
        "format": (RANK, "worker/data/splits.py"),
        "fraction": (RANK, "worker/data/mixing.py"),
        "weight": (RANK, "sources/mixture.py"),  # plan_counts, called by worker/data/prepare.py
        "samples": (RANK, "sources/mixture.py"),
        "train_on_prompt": (RANK, "worker/data/splits.py"),
        "loader": (RANK, "worker/data/splits.py"),
        "files": (RANK, "worker/data/splits.py"),
        "detected": (RANK, "worker/data/splits.py"),
    },
    # TrainerArgs.kwargs and FsdpConfig.kwargs: the method's config every rank builds (worker/training/config.py)
    TrainerArgs: {name: (RANK, "decide/spec.py") for name in (f.name for f in fields(TrainerArgs))},
    FsdpConfig: {name: (RANK, "decide/spec.py") for name in (f.name for f in fields(FsdpConfig))},
    DistributedSizes: {  # DistributedConfig(**kwargs()) given to from_pretrained (worker/loading/pretrained.py)
        "fsdp_size": (RANK, "decide/spec.py"),
        "ep_size": (RANK, "decide/spec.py"),
    },
    Loading: {
        "path": (RANK, "worker/loading/build.py"),
        "why": (RANK, "worker/loading/build.py"),  # into the load report; the plan shows it too
        "sharded": (RANK, "worker/loading/build.py"),
        "transformers_fsdp_config": (RANK, "decide/spec.py"),  # RankSpec.trainer_args_on, for a rank falling back
        "distributed_config": (RANK, "worker/loading/pretrained.py"),  # from_pretrained(distributed_config=...)
    },
    ShardedPlan: {
        "layer_cls": (RANK, "worker/loading/sharded.py"),
        "reshard_after_forward": (RANK, "worker/loading/sharded.py"),
        "activation_checkpointing": (RANK, "worker/loading/sharded.py"),
        "activation_checkpointing_offload": (RANK, "worker/loading/sharded.py"),
        "cpu_offload": (RANK, "worker/loading/sharded.py"),
        "mp_policy": (RANK, "worker/loading/sharded.py"),
        "upcast_trainable": (RANK, "worker/loading/sharded.py"),
        "may_fall_back": (RANK, "worker/loading/build.py"),
    },
}
# shared code the ranks run besides worker/ (the spec itself, and the data conversion both sides use)
RANK_SIDE = ("worker/", "decide/spec.py", "sources/mixture.py", "sources/encode.py", "sources/rows.py")
RANK_SIDE += ("rewards/load.py",)  # the user's reward imported, by the pre-flight's probe and the ranks alike
RANK_SIDE += ("config/lora_fields.py",)  # LoraSpec.kwargs: the LoraConfig every rank builds

# The only environment the worker reads, and where: torchrun's, and test hooks that act only when a test sets them.
ENV = {
    "worker/rank.py": {"RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"},
    "worker/faults.py": {
        "FSDP_TUNE_TEST_KILL",
        "FSDP_TUNE_TEST_HANG",
        "FSDP_TUNE_TEST_POISON_STEP",
        "FSDP_TUNE_TEST_FAKE_HUB",
        "FSDP_TUNE_TEST_SHORT_GENERATION",
        "FSDP_TUNE_TEST_UNMANAGED",
        "FSDP_TUNE_TEST_COPIED_EXPERTS",
    },
    # a debugging switch that changes which ranks' lines reach the console, never what a rank runs
    "worker/logs.py": {"FSDP_TUNE_ALL_RANKS_TO_CONSOLE"},
    # where --report_to's trackers wrote, for the summary to say: the trackers' own settings, read, not decided on
    "worker/summary.py": {"WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"},
    # switched off while a reward run's base loads whole on every rank (transformers reads it), then put back
    "worker/training/rewards.py": {"FSDP_CPU_RAM_EFFICIENT_LOADING"},
}

# What the worker may import of fsdp_tune outside worker/: the spec, the run folder's names and markers, the
# summary, data conversion shared with the launcher, template texts, the checkpoint file names. Nothing that
# reads the user's config or decides.
ALLOWED_IMPORTS = {
    "fsdp_tune",  # __version__
    "fsdp_tune.decide.spec",
    "fsdp_tune.rundir.checkpoints",  # completion markers, the newest complete checkpoint after a restart
    "fsdp_tune.decide.loading",  # checkpoint file names and the remote-code predicate a rank applies itself
    "fsdp_tune.runfiles",
    "fsdp_tune.printable",  # the console door's escapes: a line's control characters shown escaped, no decision
    "fsdp_tune.summary",
    "fsdp_tune.config.templates",
    "fsdp_tune.sources.convert",
    "fsdp_tune.sources.formats",
    "fsdp_tune.sources.mixture",
    "fsdp_tune.sources.rowcheck",
    "fsdp_tune.sources.preference",  # preference rows: detected and converted as the launcher checks them
    "fsdp_tune.sources.preference_rows",
    "fsdp_tune.sources.encode",  # rows rendered, masked and cut, as the launcher's pre-flight counts them
    "fsdp_tune.sources.rows",
    "fsdp_tune.sources.sample",  # a JSON file's rows parsed as the pre-flight parses them, where datasets would not
    "fsdp_tune.config.methods",  # the methods' names and the metric names each logs: a table, no decision
    "fsdp_tune.config.model_kinds",  # the model kinds' Auto classes and whether they have a processor: a table
    "fsdp_tune.sources.vision",  # images in the rows: converted as the launcher checks them
    "fsdp_tune.sources.vision_rows",  # rows with images measured and cut, each image's tokens counted
    "fsdp_tune.models.processor",  # a vision-language model's processor loaded and saved, torchvision or not
    "fsdp_tune.sources.prompts",  # GRPO's prompt rows: detected and converted as the launcher checks them
    "fsdp_tune.rewards.builtin",  # the built-in rewards, the user's imported, every result checked: the callables
    "fsdp_tune.rewards.guard",
    "fsdp_tune.rewards.load",
    "fsdp_tune.config.folders",  # the loader door's rules (bounded readers, remote code, adapter bounds): no decision
    "fsdp_tune.sources.modelcheck",  # the model types transformers knows, read from its text (the loader door)
    "fsdp_tune.sources.model",  # where the Hub cache is (the loader door finds a cached model's folder)
    "fsdp_tune.sources.versions",  # the version-specific paths (FACTS), read where a rank takes them: a table
}


def _source(rel: str) -> str:
    return (PACKAGE / rel).read_text()


def _reads(rel: str, name: str) -> bool:
    """`rel` reads `name`: as an attribute (spec.seed) or, for code reading the spec's JSON, a key."""
    for node in ast.walk(ast.parse(_source(rel))):
        if isinstance(node, ast.Attribute) and node.attr == name:
            return True
        if isinstance(node, ast.Constant) and node.value == name:
            return True
    return False


CASES = [(cls, name) for cls, table in READERS.items() for name in table]


@pytest.mark.parametrize("cls", list(READERS), ids=lambda c: c.__name__)
def test_every_field_has_a_reader(cls) -> None:
    assert set(READERS[cls]) == {f.name for f in fields(cls)}, f"{cls.__name__}: fields and their readers differ"


@pytest.mark.parametrize("cls,name", CASES, ids=[f"{c.__name__}.{n}" for c, n in CASES])
def test_each_reader_reads_its_field(cls, name: str) -> None:
    how, rel = READERS[cls][name]
    assert _reads(rel, name), f"{cls.__name__}.{name}: {rel} does not read it ({how})"
    expected = {
        RANK: RANK_SIDE,
        TORCHRUN: ("launch/torchrun.py",),
        PLAN: (PLAN_TEXT, "output/data.py"),  # run.py's data lines, kept there
        AFTER: ("tools/",),
        PREFLIGHT: ("preflight/", "rundir/", "launch/", "trace/"),
    }[how]
    assert rel.startswith(expected), f"{cls.__name__}.{name}: {rel} is not where {how} happens"


def _worker_files() -> list[Path]:
    return sorted((PACKAGE / "worker").rglob("*.py"))


def _constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):  # KILL, HANG = "...", "..."
            for target in node.targets:
                if isinstance(target, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts, strict=False):
                        if isinstance(t, ast.Name) and isinstance(v, ast.Constant):
                            out[t.id] = v.value
    return out


def _environment_reads(path: Path) -> list[tuple[int, str | None]]:
    """(line, key) of every read of os.environ / os.getenv in `path`; key None: a read whose key cannot be named
    (iteration, a computed key). os.environ.update (the spec's env, exported) is a write."""
    tree = ast.parse(path.read_text())
    consts = _constants(tree)

    def key(arg: ast.expr | None) -> str | None:
        if isinstance(arg, ast.Constant):
            return arg.value
        return consts.get(arg.id) if isinstance(arg, ast.Name) else None

    reads, accounted = [], 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            reads.append((node.lineno, key(node.args[0] if node.args else None)))
            accounted += 1
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            reads.append((node.lineno, key(node.slice)))
            accounted += 1
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "os.environ.update":
            accounted += 1
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            reads += [(node.lineno, None) for a in node.names if a.name in ("environ", "getenv")]
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv")]
    if len(uses) != accounted:
        reads.append((uses[0].lineno, None))  # os.environ used some other way: copied, iterated, `in`
    return reads


def test_the_worker_reads_no_environment_but_torchruns() -> None:
    wrong = []
    for path in _worker_files():
        rel = str(path.relative_to(PACKAGE))
        for line, key in _environment_reads(path):
            if key is None or key not in ENV.get(rel, set()):
                wrong.append(f"{rel}:{line} reads {key or 'the environment'}")
    assert not wrong, "the worker decides from the environment instead of the spec:\n" + "\n".join(wrong)


def test_the_worker_imports_no_launcher_decision_and_rereads_no_config() -> None:
    wrong = []
    for path in _worker_files():
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                ours = name == "fsdp_tune" or name.startswith("fsdp_tune.")
                if ours and not name.startswith("fsdp_tune.worker") and name not in ALLOWED_IMPORTS:
                    wrong.append(f"{rel}:{node.lineno} imports {name}")
            subscript = isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            if subscript and node.slice.value == "config":
                wrong.append(f"{rel}:{node.lineno} reads the resolved file's config")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "flags",
    [
        ("--use_peft_lora", "--bf16", "True", "--fsdp_activation_checkpointing", "true"),
        ("--use_peft_lora", "--use_4bit_quantization", "True", "--bnb_4bit_quant_storage_dtype", "bfloat16"),
        ("--use_peft_lora", "--fsdp_version", "1", "--eval_strategy", "steps", "--seed", "7"),
        ("--use_peft_lora", "--use_rslora", "True", "--bias", "lora_only", "--lora_target_modules", "all-linear"),
        ("--use_peft_lora", "--num_processes", "2", "--use_parallelism_config", "--parallelism_config_cp_size", "2"),
    ],
    ids=["sharded LoRA", "QLoRA", "FSDP1 with eval", "LoRA by PEFT's names", "context parallel mesh"],
)
def test_the_spec_reaches_the_ranks_typed(flags) -> None:
    """What the ranks read back from the JSON file is the spec the launcher decided, typed: tuples, nested
    dataclasses and all (from_dict(as_dict) is the identity)."""
    spec = spec_for(*flags, "--output_dir", "/tmp/walk", machine=Machine(cuda=True, gpus=2))
    again = from_dict(spec.as_dict())
    assert again == spec
    assert isinstance(again.loading, Loading) and isinstance(again.world, World)
    if again.loading.sharded is not None:
        assert isinstance(again.loading.sharded, ShardedPlan) and isinstance(again.loading.sharded.layer_cls, tuple)
    assert isinstance(again.lora, LoraSpec) and again.lora.kwargs() == spec.lora.kwargs()
    assert isinstance(again.trainer_args, TrainerArgs) and isinstance(again.fsdp_config, FsdpConfig)
    assert again.trainer_args_on("transformers") == spec.trainer_args_on("transformers")
    if "--eval_strategy" in flags:  # the user's other settings pass by TRL's names, as given
        assert again.trainer_args.trl_args["eval_strategy"] == "steps" and again.trainer_args.trl_args["seed"] == 7
    if "--use_4bit_quantization" in flags:  # the QLoRA storage policy, typed, and the builder's the same
        assert (
            isinstance(again.fsdp_mixed_precision, MixedPrecision)
            and again.fsdp_mixed_precision.param_dtype == "bfloat16"
        )
        assert again.loading.sharded is None or again.loading.sharded.mp_policy == again.fsdp_mixed_precision
    if "--use_rslora" in flags:  # a field fsdp-tune decides is typed, whoever set it; PEFT's others as given
        assert again.lora.bias == "lora_only" and again.lora.peft_args == {"use_rslora": True}
        assert again.lora.kwargs()["bias"] == "lora_only" and again.lora.target_modules == "all-linear"
    if "--use_parallelism_config" in flags:
        assert isinstance(again.parallelism, Mesh) and again.parallelism.sizes()["cp_size"] == 2
        assert again.parallelism.cp_comm_strategy == "allgather" and again.parallelism.dp_shard_size == 1
