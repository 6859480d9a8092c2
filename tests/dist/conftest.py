"""Real multi-process runs on CPU (gloo, FSDP2) through the `fsdp-tune` CLI, with bounded timeouts.

On failure the assertion message carries every rank's log, so a broken run explains itself in CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO, offline_env

BASE = FIXTURES / "tiny_lora.yaml"
TIMEOUT = int(os.environ.get("FSDP_TUNE_TEST_TIMEOUT", "300"))


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    output_dir: Path

    @property
    def summary(self) -> dict:
        return json.loads((self.output_dir / "fsdp_tune_summary.json").read_text())

    def logs(self) -> str:
        parts = [
            f"--- exit {self.proc.returncode}\n--- stdout\n{self.proc.stdout[-4000:]}\n--- stderr\n"
            f"{self.proc.stderr[-6000:]}"
        ]
        return "\n".join([*parts, *rank_logs(self.output_dir)])


def rank_logs(output_dir: Path, label: str = "") -> list[str]:
    """The end of every rank's log in a run's folder, for a failing assertion's message."""
    logs = sorted((output_dir / "logs").glob("rank-*.log"))
    return [f"--- {label}{log.name}\n{log.read_text()[-4000:]}" for log in logs]


def run_train(
    out: Path,
    model_cache: Path,
    *flags: str,
    config: Path = BASE,
    check: bool = True,
    env: dict | None = None,
    timeout: int = TIMEOUT,
) -> Run:
    """`fsdp-tune train --config CONFIG --output_dir OUT FLAGS...` as a user runs it, offline."""
    cmd = [sys.executable, "-m", "fsdp_tune", "train", "--config", str(config), "--output_dir", str(out), *flags]
    full_env = offline_env(model_cache)
    full_env.update(env or {})  # a test may override any of these
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    run = Run(proc, out)
    if check:
        assert proc.returncode == 0, run.logs()
    return run


@pytest.fixture
def train(tmp_path, model_cache):
    """A run of the test's own (into tmp_path/run unless output_dir says otherwise)."""

    def _train(*flags: str, output_dir: Path | None = None, **kw) -> Run:
        return run_train(output_dir or tmp_path / "run", model_cache, *flags, **kw)

    return _train


# The reference run: the base config (LoRA, FSDP2, 2 CPU ranks), 6 steps, a SHARDED_STATE_DICT checkpoint every 2.
# Tests that only read a finished run's outputs (its adapter, summary, logs, checkpoints) share this one launch.
REFERENCE = ("--save_strategy", "steps", "--save_steps", "2", "--max_steps", "6")


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, model_cache) -> Run:
    """Read only: a test that changes what it finds copies it first."""
    return run_train(tmp_path_factory.mktemp("reference") / "run", model_cache, *REFERENCE)


# A group launch: several runs that each test only reads afterwards (their summary, adapter, checkpoints, logs), one
# after another in ONE torchrun launch (tests/dist/recipes_in_one_group.py): one start-up (~25 s of imports on
# 2 cores) for the group instead of one per run. Each member is planned by the launcher's own plan_run (what
# `train` runs before it launches), its plan is the text `train` prints, and its ranks run the whole rank recipe.
# What the launcher itself does around a launch (torchrun's command, the output folder's lock, the manifest,
# faults, signals) is tested by runs of their own through the CLI.


@dataclass
class Member:
    """One run of a group launch."""

    name: str
    planned: object  # fsdp_tune.launch.train.Planned
    resolved: Path  # the rank spec its ranks read (OUTPUT_DIR/fsdp_tune_resolved.json)
    said: list[str] = field(default_factory=list)  # what the launcher said while planning it (its stderr)
    group: GroupLaunch | None = None

    @property
    def output_dir(self) -> Path:
        return Path(self.planned.spec.output_dir)

    @property
    def spec(self):
        return self.planned.spec

    @property
    def summary(self) -> dict:
        path = self.output_dir / "fsdp_tune_summary.json"
        assert path.exists(), f"{self.name} did not finish\n{self.logs()}"
        return json.loads(path.read_text())

    @property
    def plan(self) -> str:
        """The plan `train` prints for it before launching."""
        from fsdp_tune.launch import torchrun
        from fsdp_tune.output.run import describe_launch

        return describe_launch(self.planned.config, self.spec, torchrun.command(self.spec), self.planned.counted)

    @property
    def console(self) -> str:
        """What `train` would show of it: the plan, what planning said, and the summary's lines after the run."""
        from fsdp_tune import summary as run_summary
        from fsdp_tune.output.run import format_summary

        finished = run_summary.read(self.output_dir)
        assert isinstance(finished, run_summary.RunSummary), f"{self.name} did not finish\n{self.logs()}"
        return "\n".join([self.plan, *self.said, format_summary(finished)])

    def logs(self) -> str:
        parts = [self.group.logs()] if self.group else []
        return "\n".join([*parts, *rank_logs(self.output_dir, f"{self.name}: ")])


@dataclass
class GroupLaunch:
    proc: subprocess.CompletedProcess | None
    members: dict[str, Member]

    def __getitem__(self, name: str) -> Member:
        return self.members[name]

    def logs(self) -> str:
        if self.proc is None:
            return "--- the group was not launched"
        return f"--- group launch: exit {self.proc.returncode}\n--- stderr\n{self.proc.stderr[-6000:]}"


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `values` while planning (plan_run materialises builtin models where FSDP_TUNE_CACHE says)."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def plan_member(name: str, out: Path, flags: tuple[str, ...], config: Path = BASE) -> Member:
    """A run planned as `train --config CONFIG --output_dir OUT FLAGS...` plans it, and its rank spec written;
    pre-flight errors fail here, as `train` would refuse to start."""
    from fsdp_tune.launch import torchrun
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.output.findings import format_findings

    said: list[str] = []
    planned = plan_run(str(config), [*flags, "--output_dir", str(out)], said.append)
    errors = [f for f in planned.machine_findings if f.severity.value == "error"]
    assert not errors, format_findings(name, errors)
    resolved = torchrun.prepare(planned.config, planned.spec, planned.run_id).resolved_path
    return Member(name, planned, Path(resolved), said)


@dataclass
class DriverLaunch:
    """One torchrun launch of a test driver over its plan's runs (tests/dist/arch_driver.py run_plan)."""

    proc: subprocess.CompletedProcess
    results: dict[str, dict | None]  # run name -> rank 0's OUTPUT_DIR/{driver}_result.json (None: not written)
    logs: str  # the end of every rank's log


def launch_driver(
    driver: str, root: Path, runs: list[dict], outs: Mapping[str, Path], model_cache: Path, timeout: int
) -> DriverLaunch:
    """`torchrun --standalone --nproc_per_node 2 tests/dist/{driver}_driver.py PLAN.json` over `runs` (each with its
    name and resolved rank spec), offline; `outs`: run name -> its output folder. A hang fails the test at `timeout`
    instead of blocking it."""
    plan = root / "plan.json"
    plan.write_text(json.dumps({"runs": runs, "log_dir": str(root / "driver")}))
    env = dict(offline_env(model_cache), PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    script = str(REPO / "tests" / "dist" / f"{driver}_driver.py")
    proc = subprocess.run([*cmd, script, str(plan)], capture_output=True, text=True, timeout=timeout, env=env)
    results = {}
    for name, out in outs.items():
        path = out / f"{driver}_result.json"
        results[name] = json.loads(path.read_text()) if path.exists() else None
    logs = "".join(p.read_text()[-3000:] for p in sorted((root / "driver" / "logs").glob("rank-*.log")))
    return DriverLaunch(proc, results, logs)


def launch_group(
    root: Path,
    model_cache: Path,
    runs: Mapping[str, tuple[str, ...]],
    nproc: int = 2,
    configs: Mapping[str, Path] | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
    before_launch: Callable[[Mapping[str, Member]], None] | None = None,
) -> GroupLaunch:
    """Plan every run (into root/NAME, from configs[NAME] or the base config) and run them all in one torchrun
    launch of `nproc` ranks. A run that fails stops the launch: the runs after it have no summary, and their
    tests fail with the group's and their own logs (`check`: fail here; `before_launch`: given the planned runs,
    e.g. to point one at a checkpoint an earlier run of the launch writes)."""
    full_env = dict(offline_env(model_cache), **(env or {}))
    with environment(full_env):
        members = {n: plan_member(n, root / n, flags, (configs or {}).get(n, BASE)) for n, flags in runs.items()}
    for member in members.values():
        assert member.spec.world.world_size == nproc, (member.name, member.spec.world)
    if before_launch is not None:
        before_launch(members)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += ["-m", "tests.dist.recipes_in_one_group", *(str(m.resolved) for m in members.values())]
    timeout = TIMEOUT + 60 * len(members)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)
    group = GroupLaunch(proc, members)
    for member in members.values():
        member.group = group
    if check:
        assert proc.returncode == 0, group.logs()
    return group


QLORA = ("--use_4bit_quantization", "True", "--bnb_4bit_quant_storage_dtype", "float32")
QLORA += ("--bnb_4bit_compute_dtype", "float32")
FSDP_AC = ("--fsdp_activation_checkpointing", "true", "--gradient_checkpointing", "false")
SAVE_EVERY_2_OF_4 = ("--save_strategy", "steps", "--save_steps", "2", "--max_steps", "4")

# The base config's variants on 2 ranks, one group launch for the session (tests/dist/test_train_variants.py,
# test_after_training.py read them)
VARIANTS = {
    "qlora": (*QLORA, "--use_nested_quant", "True", "--max_steps", "4"),
    "dora": ("--use_dora", "True", "--max_steps", "4"),
    "fsdp-ac full checkpoints": (*FSDP_AC, *SAVE_EVERY_2_OF_4, "--fsdp_state_dict_type", "FULL_STATE_DICT"),
    "full checkpoints": ("--fsdp_state_dict_type", "FULL_STATE_DICT", *REFERENCE),
    "zephyr": ("--chat_template_format", "zephyr", "--max_steps", "2"),
}


# Context parallelism (cp 2 on 2 ranks: one data-parallel replica, a global batch of 8) against one process on the
# same batches, both evaluated once on the same held-out rows (tests/dist/test_train_variants.py)
EVAL_ONCE = ("--test_split_size", "0.2", "--eval_strategy", "steps", "--eval_steps", "6")
EVAL_ONCE += ("--per_device_eval_batch_size", "8", "--per_device_train_batch_size", "8", "--max_steps", "6")
CP2 = ("--use_parallelism_config", "--parallelism_config_cp_size", "2", "--parallelism_config_dp_shard_size", "1")


def mixture(root: Path) -> Path:
    """The base recipe on a mixture of every format from every kind of source (tests/datafiles.py every_source),
    packed, evaluated on held-out rows every 2 steps with the best checkpoint kept (tests/dist/test_data_train.py)."""
    import yaml

    from tests.datafiles import every_source

    config = yaml.safe_load(BASE.read_text())
    data = {k: v for k, v in config["data"].items() if k != "dataset_name"}
    config["data"] = data | {"test_split_size": 0.2, "packing": True}  # masks go through TRL's BFD packing
    config["datasets"] = every_source(root / "data")
    config["training"].update(
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        per_device_eval_batch_size=8,
    )
    recipe = root / "mixture.yaml"
    recipe.write_text(yaml.safe_dump(config))
    return recipe


# Sharded loading against from_pretrained (tests/dist/test_sharded_loading.py): each case trained on both paths, in
# the variants' launch (a launch of their own cost ~20 CPU-s of start-up more)
SHARDED_CASES = {
    "lora": (),
    "qlora": (*QLORA, "--use_nested_quant", "True"),
    "grown vocabulary, FSDP AC, bf16": ("--chat_template_format", "zephyr", "--fsdp_activation_checkpointing", "true")
    + ("--bf16", "True"),
    "small-llama": ("--model_name_or_path", "builtin:small-llama", "--max_seq_len", "64")
    + ("--per_device_train_batch_size", "2", "--max_steps", "2"),
}
LOADING_PATHS = ("transformers", "sharded")
FALLBACK = "fallback on the ranks"


def loading_name(case: str, path: str) -> str:
    return f"{case.replace(' ', '_').replace(',', '')}-{path}"  # the run's folder


def without_lm_head(folder: Path, copy: Path) -> str:
    """The tiny model with lm_head.weight missing from its checkpoint: from_pretrained initialises it (randomly,
    with a warning); sharded loading cannot, and only a rank reading the checkpoint finds out."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, copy)
    tensors = load_file(str(copy / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return str(copy)


def loading_runs(root: Path, model_cache: Path) -> dict[str, tuple[str, ...]]:
    """SHARDED_CASES and FALLBACK (the tiny model without its lm_head) on each loading path: --loading transformers,
    or auto, which the launcher resolves to sharded."""
    from fsdp_tune.sources.builtin import materialize

    with environment(offline_env(model_cache)):  # where the ranks read the builtin models
        broken = without_lm_head(materialize("tiny-llama"), root / "m")
    cases = {**SHARDED_CASES, FALLBACK: ("--model_name_or_path", broken)}
    return {
        loading_name(case, path): ("--max_steps", "3", *flags, "--loading", "auto" if path == "sharded" else path)
        for case, flags in cases.items()
        for path in LOADING_PATHS
    }


@pytest.fixture(scope="session")
def variants(tmp_path_factory, model_cache) -> GroupLaunch:
    """Read only, as the reference run. The mixture and context parallelism run after the VARIANTS, then the loading
    pairs (a run that fails stops those after it); the mixture brings its Hub dataset's cache (HF_DATASETS_CACHE: the
    others' local files cache there as well)."""
    root = tmp_path_factory.mktemp("variants")
    runs = {**VARIANTS, "mixture": (), "cp": (*CP2, *EVAL_ONCE), **loading_runs(root, model_cache)}
    configs = {"mixture": mixture(root)}
    return launch_group(root, model_cache, runs, configs=configs, env={"HF_DATASETS_CACHE": str(root / "data" / "hub")})


# Runs that start from the reference run's and the variants' files, one group launch for the session: first the
# 125M model whose peak RSS tests/dist/test_plan_measured.py measures (MEASURED below), then the reference run
# replayed from its manifest (tests/dist/test_after_training.py), a copy of each straight run's checkpoints resumed
# with `latest` past an interrupted save (tests/dist/test_train_variants.py), and, last, the preference methods on
# their probe, DPO from the reference run's SFT adapter among them (tests/dist/test_preference.py). A launch of their
# own cost those runs ~20 CPU-s of start-up more each. Each is planned by plan_run, as `train` plans it (the manifest
# read as a config, `latest` resolved, what planning says kept in Member.said); how `train` itself says a resume on
# the console: tests/dist/test_preemption.py.
RESUMED = {"SHARDED_STATE_DICT": "reference", "FULL_STATE_DICT": "full checkpoints"}
# The 125M-parameter model whose peak RSS tests/dist/test_plan_measured.py compares with the planner's prediction:
# the launch's first run, so its ranks' peak (ru_maxrss, a process's) is its own, as in a launch of its own
MEASURED = ("--model_name_or_path", "builtin:small-llama", "--max_seq_len", "128")

# the preference probe (tests/dist/test_preference.py): random prompts, one constant preferred and one constant
# rejected answer
GOOD, BAD = "I am glad to help with that.", "Go away, I will not answer."
WORDS = "the cat dog sun moon tree river house car blue red green small big fast slow happy old new".split()
PREFERENCE_STEPS = ("--max_steps", "10", "--learning_rate", "0.01", "--per_device_train_batch_size", "4")


def prompts(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(n)]


def preference_probe(root: Path) -> dict[str, Path]:
    """The probe's files: plain pairs, conversations, unpaired rows."""
    from tests.datafiles import jsonl

    asked = prompts(48, 0)
    pairs = [{"prompt": f"Question: {p}\nAnswer:", "chosen": f" {GOOD}", "rejected": f" {BAD}"} for p in asked]
    chats = [
        {
            "chosen": [{"role": "user", "content": p}, {"role": "assistant", "content": GOOD}],
            "rejected": [{"role": "user", "content": p}, {"role": "assistant", "content": BAD}],
        }
        for p in asked
    ]
    unpaired = [
        {"prompt": f"Question: {p}\nAnswer:", "completion": f" {a}", "label": a == GOOD}
        for p in asked
        for a in (GOOD, BAD)
    ]
    root.mkdir(parents=True, exist_ok=True)
    return {
        "pairs": jsonl(root / "pairs.jsonl", pairs),
        "chats": jsonl(root / "chats.jsonl", chats),
        "unpaired": jsonl(root / "kto.jsonl", unpaired),
    }


def preference_runs(root: Path, sft: Path) -> dict[str, tuple[str, ...]]:
    """Every preference method on the probe, and DPO continuing `sft` (an SFT run's adapter: the policy's start and
    the reference)."""
    data = preference_probe(root)
    return {
        "dpo": ("--method", "dpo", "--dataset_name", str(data["pairs"]), *PREFERENCE_STEPS),
        "dpo-chats": ("--method", "dpo", "--dataset_name", str(data["chats"]), *PREFERENCE_STEPS),
        "kto": ("--method", "kto", "--dataset_name", str(data["unpaired"]), *PREFERENCE_STEPS),
        "reward": ("--method", "reward", "--dataset_name", str(data["pairs"]), *PREFERENCE_STEPS),
        "from-sft": ("--method", "dpo", "--adapter", str(sft), "--dataset_name", str(data["chats"]))
        + ("--max_steps", "6", "--learning_rate", "0.001"),
    }


@pytest.fixture(scope="session")
def continued(tmp_path_factory, model_cache, reference_run, variants) -> GroupLaunch:
    """Read only. "measured": MEASURED, first (tests/dist/test_plan_measured.py); "replay": the reference run's
    fsdp_tune_run.json as the config; "resumed STATE_DICT_TYPE": its straight run's checkpoint-2 and checkpoint-4
    copied, checkpoint-4's completion marker removed (a save cut short: skipped, never deleted), then
    `--resume_from_checkpoint latest` to step 6; then preference_runs, last (a run that fails stops those after
    it)."""
    import shutil

    root = tmp_path_factory.mktemp("continued")
    runs = {"measured": (*MEASURED, "--max_steps", "2"), "replay": ()}  # "measured" first: a fresh process's RSS
    configs = {"replay": reference_run.output_dir / "fsdp_tune_run.json"}
    for state_dict_type, straight in RESUMED.items():
        name = f"resumed {state_dict_type}"
        source = reference_run.output_dir if straight == "reference" else variants[straight].output_dir
        for step in (2, 4):
            shutil.copytree(source / f"checkpoint-{step}", root / name / f"checkpoint-{step}")
        (root / name / "checkpoint-4" / "fsdp_tune_complete").unlink()
        runs[name] = ("--fsdp_state_dict_type", state_dict_type, *REFERENCE, "--resume_from_checkpoint", "latest")
    runs |= preference_runs(root / "preference-data", reference_run.output_dir)
    return launch_group(root, model_cache, runs, configs=configs)


def constant_answer(path: Path) -> Path:
    """Random numbers as the prompt, one constant answer: only the answer can be learned."""
    import random

    from tests.datafiles import jsonl

    rnd = random.Random(0)
    rows = []
    for _ in range(320):
        prompt = " ".join(str(rnd.randint(0, 999)) for _ in range(rnd.randint(6, 12)))
        turns = [{"from": "human", "value": prompt}, {"from": "gpt", "value": "The answer is always the same."}]
        rows.append({"conversations": turns})
    return jsonl(path, rows)


@pytest.fixture(scope="session")
def one_rank(tmp_path_factory, model_cache) -> GroupLaunch:
    """Runs on one rank, one group launch for the session: the one-process side of the parity tests (a global batch
    of 8, as the reference run's; evaluated, as the context-parallel run's), QLoRA under FSDP activation
    checkpointing, and the loss-on-answers probe (full fine-tuning, 40 steps, on the answers only and on
    everything)."""
    root = tmp_path_factory.mktemp("one-rank")
    data = constant_answer(root / "constant.jsonl")
    probe = ("--dataset_name", str(data), "--num_processes", "1", "--use_peft_lora", "false", "--max_steps", "40")
    probe += ("--per_device_train_batch_size", "8", "--learning_rate", "0.003", "--lr_scheduler_type", "constant")
    probe += ("--logging_steps", "5")
    runs = {
        "one process": ("--max_steps", "6", "--num_processes", "1", "--per_device_train_batch_size", "8"),
        "one process eval": ("--num_processes", "1", *EVAL_ONCE),  # the context-parallel run's reference
        "qlora fsdp-ac": ("--num_processes", "1", *QLORA, *FSDP_AC, *SAVE_EVERY_2_OF_4),
        "answers": probe,
        "everything": (*probe, "--train_on_inputs"),  # axolotl's spelling
    }
    return launch_group(root / "runs", model_cache, runs, nproc=1)
