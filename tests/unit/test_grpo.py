"""GRPO on the launcher side (#32), without torch: what a --reward_funcs entry names, every reward result checked,
prompt-only data, the user's reward called on one row (in this process here; the pre-flight's subprocess is
tests/lib/test_grpo_pieces.py), the rank spec's GRPO part, the trace's refusal, the plan's advice (the memory plan
measures the model with torch: tests/lib/test_grpo_pieces.py)."""

from __future__ import annotations

import json
import math

import pytest

from fsdp_tune.config.methods import metric_keys, row_of
from fsdp_tune.decide.spec import RewardSpec, from_dict
from fsdp_tune.rewards.guard import RewardError, guarded, problem
from fsdp_tune.rewards.probe import probe_one
from fsdp_tune.rewards.resolve import Unresolved, resolve
from fsdp_tune.sources.formats import Format, FormatError
from fsdp_tune.sources.prompts import canonical, detect_prompts
from tests.conftest import FIXTURES, checked_spec, spec_for

RECIPE = str(FIXTURES / "configs" / "recipe_grpo.yaml")
USER_REWARDS = """
import math

def fewer_chars(completions, budget, **kwargs):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [-len(t) / b for t, b in zip(texts, budget)]

def raises(completions, **kwargs):
    return [1.0 / (len(c) - len(c)) for c in completions]

def one_short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)

def not_a_number(completions, **kwargs):
    return [math.nan for _ in completions]

def as_text(completions, **kwargs):
    return ["1" for _ in completions]

async def later(completions, **kwargs):
    return [0.5 for _ in completions]
"""


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('a package is not imported to be found')\n")
    (tmp_path / "pkg" / "scores.py").write_text(USER_REWARDS)
    return path


def test_a_reward_entry_is_found_without_running_it(rewards_file, tmp_path) -> None:
    """Built-ins by name, a file's function, a module's function (TRL's dotted spelling and the colon one): located
    and read with ast (pkg/__init__.py raises when imported: it is not), never imported here."""
    cwd = str(tmp_path)
    assert resolve("length_reward", cwd) == RewardSpec("length_reward", "builtin", "length_reward", "length_reward")
    mine = resolve("my_rewards.py:fewer_chars", cwd)
    assert (mine.kind, mine.target, mine.attr, mine.search_path) == ("python", str(rewards_file), "fewer_chars", cwd)
    for entry in ("pkg.scores.fewer_chars", "pkg.scores:fewer_chars"):
        found = resolve(entry, cwd)
        assert (found.kind, found.target, found.attr, found.name) == (
            "python",
            "pkg.scores",
            "fewer_chars",
            "fewer_chars",
        )
    assert "pkg" not in __import__("sys").modules


@pytest.mark.parametrize(
    "entry,said,hint",
    [
        ("lenght_reward", "is not a built-in reward", "--reward_funcs length_reward"),
        ("my_rewards.py:fewer_char", "defines no fewer_char (its functions: as_text, fewer_chars,", "fewer_chars"),
        ("missing.py:score", "missing.py does not exist", "path/to/file.py:fn"),
        ("nopkg.scores.fn", "no module nopkg.scores on the Python path", "nopkg/scores.py:fn"),
        ("broken.py:fn", "broken.py:1: broken.py:fn: the file does not parse", "fix the file"),
        ("a_folder", "is a folder but not a reward model", "--method reward run"),
    ],
)
def test_an_entry_that_names_nothing_says_what_was_looked_for(rewards_file, tmp_path, entry, said, hint) -> None:
    (tmp_path / "broken.py").write_text("def fn(:\n    pass\n")
    (tmp_path / "a_folder").mkdir()
    with pytest.raises(Unresolved) as e:
        resolve(entry, str(tmp_path))
    assert said in str(e.value) and hint in e.value.hint, (str(e.value), e.value.hint)


def test_a_reward_model_is_a_reward_run_or_a_sequence_classifier(tmp_path) -> None:
    run = tmp_path / "rm"
    run.mkdir()
    (run / "adapter_config.json").write_text("{}")
    (run / "fsdp_tune_resolved.json").write_text(json.dumps({"spec": {"method": {"name": "reward", "head": "score"}}}))
    assert resolve(str(run)).kind == "reward_run" and resolve(str(run)).name == "rm"
    (run / "fsdp_tune_resolved.json").write_text(json.dumps({"spec": {"method": {"name": "sft", "head": "lm"}}}))
    with pytest.raises(Unresolved, match="is a --method sft run, not a reward model"):
        resolve(str(run))
    classifier = tmp_path / "clf"
    classifier.mkdir()
    (classifier / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"]}))
    assert resolve(str(classifier)).kind == "reward_model"


@pytest.mark.parametrize(
    "values,why",
    [
        ([1.0, None], None),
        ([1, 0.5], None),
        ((0.0, 1.0), None),
        ([1.0], "returned 1 values for 2 completions"),
        ("10", "returned str, not a list of numbers"),
        ([1.0, math.nan], "returned nan at position 1 (None, not NaN,"),
        ([math.inf, 1.0], "returned inf at position 0"),
        ([True, 1.0], "returned bool True at position 0"),
        ([1.0, "2"], "returned str '2' at position 1"),
    ],
)
def test_what_a_reward_returns_is_checked(values, why) -> None:
    found = problem(values, 2)
    assert (found is None) if why is None else (found is not None and found.startswith(why)), found


def test_a_guarded_reward_fails_in_one_line_naming_itself_and_the_step() -> None:
    def flaky(completions, **kwargs):
        raise KeyError("answer")

    call = guarded(flaky, "flaky", "my_rewards.py:flaky", step=lambda: 3)
    with pytest.raises(RewardError) as e:
        call(prompts=["p", "p"], completions=["a", "b"])
    assert str(e.value) == "reward flaky (my_rewards.py:flaky) raised at step 3: KeyError: 'answer'"
    assert call.__name__ == "flaky"  # TRL logs it as rewards/flaky/mean
    short = guarded(lambda completions, **kw: [1.0], "short", "f.py:short")
    with pytest.raises(RewardError, match=r"^reward short \(f.py:short\) returned 1 values for 2 completions"):
        short(prompts=["p", "p"], completions=["a", "b"])


def test_an_async_reward_stays_async() -> None:
    import asyncio
    import inspect

    async def later(completions, **kwargs):
        return [0.5 for _ in completions]

    call = guarded(later, "later", "f.py:later")
    assert inspect.iscoroutinefunction(call)
    assert asyncio.run(call(completions=["a", "b"])) == [0.5, 0.5]


@pytest.mark.parametrize(
    "attr,said",
    [
        ("fewer_chars", None),
        ("later", None),
        ("raises", "raised at "),
        ("one_short", "returned 1 values for 2 completions"),
        ("not_a_number", "returned nan at position 0"),
        ("as_text", "returned str '1' at position 0"),
    ],
)
def test_the_probe_calls_the_users_reward_on_one_row(rewards_file, tmp_path, attr, said) -> None:
    """What the pre-flight's probe reports for each way a reward can fail, the raising line named (file:line)."""
    spec = resolve(f"my_rewards.py:{attr}", str(tmp_path))
    found = probe_one(spec, {"prompt": "Say it.", "budget": 50})
    if said is None:
        assert found is None, found
    else:
        assert found.startswith(f"reward my_rewards.py:{attr} ") and said in found, found
    if attr == "raises":
        assert f"{rewards_file}:9: ZeroDivisionError" in found


def test_the_probe_names_an_import_that_fails(tmp_path) -> None:
    (tmp_path / "bad.py").write_text("import no_such_package_here\n\ndef fn(completions, **kw):\n    return []\n")
    found = probe_one(resolve("bad.py:fn", str(tmp_path)), {"prompt": "p"})
    assert "importing" in found and "ModuleNotFoundError: No module named 'no_such_package_here'" in found


def test_prompt_only_data_is_found_by_its_prompt_column() -> None:
    plain = detect_prompts(["prompt", "answer"], [{"prompt": "2+2?", "answer": "4"}])
    assert (plain.kind, plain.columns, plain.conversational) == ("prompt_only", {"prompt": "prompt"}, False)
    chat = detect_prompts(
        ["question"], [{"question": [{"role": "user", "content": "hi"}]}], column_map={"prompt": "question"}
    )
    assert chat.conversational and chat.columns == {"prompt": "question"}
    with pytest.raises(FormatError, match="no 'prompt' column") as e:
        detect_prompts(["messages"], [{"messages": []}])
    assert "--dataset_columns prompt=COLUMN" in e.value.hint
    with pytest.raises(FormatError, match="format preference is not prompts"):
        detect_prompts(["prompt"], [], forced="preference")


def test_a_row_becomes_trls_and_its_columns_reach_the_rewards() -> None:
    fmt = Format("prompt_only", {"prompt": "q"}, conversational=False)
    row, problem_ = canonical({"q": "2+2?", "answer": "4", "completion": "4"}, fmt)
    assert problem_ is None and row == {"prompt": "2+2?", "answer": "4", "reference_completion": "4"}
    assert canonical({"q": "  "}, fmt)[1].code == "empty-prompt"
    assert canonical({"q": [{"role": "user", "content": "x"}]}, fmt)[1].code == "mixed-types"
    chats = Format("prompt_only", {"prompt": "q"}, conversational=True)
    answered = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert canonical({"q": answered}, chats)[1].code == "ends-with-answer"


def test_sft_data_without_a_prompt_is_refused_naming_what_it_is() -> None:
    from fsdp_tune.decide.datafiles import prompt_format
    from fsdp_tune.sources.mixture import Source

    with pytest.raises(FormatError, match=r"this is supervised fine-tuning data \(messages\)"):
        prompt_format(["messages"], [{"messages": [{"role": "user", "content": "hi"}]}], Source("data.jsonl"))


def test_each_reward_functions_mean_is_a_metric() -> None:
    logged = {"reward", "kl", "rewards/fewer_chars/mean", "rewards/length_reward/mean", "rewards/fewer_chars/std"}
    keys = metric_keys(row_of("grpo"), logged)
    assert keys == [
        ("reward", "reward"),
        ("kl", "KL"),
        ("rewards/fewer_chars/mean", "fewer_chars"),
        ("rewards/length_reward/mean", "length_reward"),
    ]
    assert metric_keys(row_of("dpo"), {"rewards/margins"}) == [("rewards/margins", "reward margin")]
    # #48: a reward function called `reward` is not a second "reward" beside the total in the summary
    named = metric_keys(row_of("grpo"), {"reward", "rewards/reward/mean"})
    assert named == [("reward", "reward"), ("rewards/reward/mean", "rewards/reward/mean")]


@pytest.mark.parametrize(
    "flags,reference",
    [
        ((), "off"),
        (("--beta", "0.04"), "adapter_disabled"),
    ],
)
def test_the_rank_spec_says_how_grpo_generates_and_what_it_compares_with(flags, reference) -> None:
    spec = spec_for(*flags, "--output_dir", "/tmp/g", "--use_cpu", "true", config=RECIPE)
    g = spec.generating
    assert (g.reference, g.generation, g.synced, g.weight_sync, g.max_prompt_tokens) == (
        reference,
        "transformers",
        True,
        None,
        512 - 128,
    )
    assert [r.name for r in g.rewards] == ["length_reward"]
    assert spec.trainer_args.max_length is None and spec.trainer_args.trl_args["num_generations"] == 4
    assert from_dict(spec.as_dict()) == spec  # the ranks read back what was decided, typed


def test_vllm_is_decided_as_data_with_the_adapter_alone_synced() -> None:
    from fsdp_tune.decide.machine import Machine

    spec = spec_for("--use_vllm", "true", "--output_dir", "/tmp/g", config=RECIPE, machine=Machine(cuda=True, gpus=2))
    assert (spec.device, spec.generating.generation, spec.generating.weight_sync) == ("cuda", "vllm", "adapter")
    assert from_dict(spec.as_dict()).generating == spec.generating


def test_a_starting_adapter_is_the_reference_as_a_frozen_copy(tmp_path) -> None:
    """--adapter with beta > 0: the reference is the start ("ref_adapter"), or the base with --reference base."""
    from fsdp_tune.decide.method import generation_spec

    spec, checked = checked_spec("--beta", "0.04", "--output_dir", "/tmp/g", config=RECIPE)
    cfg = checked.config
    from dataclasses import replace

    started = replace(cfg, model=replace(cfg.model, adapter=str(tmp_path), reference="adapter"))
    assert generation_spec(started, 2).reference == "ref_adapter"
    based = replace(started, model=replace(started.model, reference="base"))
    assert generation_spec(based, 2).reference == "adapter_disabled"


@pytest.mark.parametrize("flags,reference", [((), "ref_adapter"), (("--beta", "0"), "off")])
def test_rloo_is_a_generating_method_with_its_own_defaults_and_reference(flags, reference) -> None:
    """RLOO's differences from GRPO are its config's (num_generations 2, beta 0.05: a reference by default) and its
    row's copies_reference (RLOOTrainer copies the adapter into "ref" whatever beta: made before sharding, always)."""
    from fsdp_tune.validate import check

    spec = spec_for("--method", "rloo", *flags, "--output_dir", "/tmp/g", "--use_cpu", "true", config=RECIPE)
    assert spec.method.name == "rloo" and spec.method.reference_adapter and spec.generating.reference == reference
    assert [r.name for r in spec.generating.rewards] == [
        "length_reward"
    ] and "loss_type" not in spec.trainer_args.kwargs()
    one = check(RECIPE, ["--method", "rloo", "--num_generations", "1"])
    assert [f.message for f in one.errors if f.rule == "FT133"] == [
        "num_generations 1: RLOO compares at least 2 completions of each prompt"
    ]
    refused = check(RECIPE, ["--method", "rloo", "--scale_rewards", "group"])  # GRPOConfig's: not RLOOConfig's
    assert [f.rule for f in refused.errors] == ["FT110"], refused.errors


def test_the_trace_refuses_grpo_and_says_why() -> None:
    from fsdp_tune.errors import PreflightError
    from fsdp_tune.trace.guard import check_settings
    from fsdp_tune.validate import check

    cfg = check(RECIPE, ["--use_cpu", "false"]).config
    with pytest.raises(PreflightError) as e:
        check_settings(cfg)
    finding = e.value.findings[0]
    assert finding.rule == "TR002" and "its generation is not traced" in finding.message, finding


def test_plan_advice_recomputes_with_fsdps_checkpointing_under_grpo() -> None:
    """The Trainer's gradient checkpointing would be refused for GRPO (FT116): the advice offers FSDP's."""
    from fsdp_tune.planner.advice import axes
    from fsdp_tune.validate import check

    cfg = check(RECIPE, ["--fsdp_activation_checkpointing", "false", "--gradient_checkpointing", "false"]).config
    change = next(c for axis in axes(cfg, "sharded") for c in axis if c is not None and c.axis == "checkpointing")
    assert change.apply(cfg).fsdp.activation_checkpointing and not change.apply(cfg).training.get(
        "gradient_checkpointing"
    )
