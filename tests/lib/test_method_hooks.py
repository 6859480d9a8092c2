"""The ranks' side of every method row (worker/training/methods.py): a hook for each row and a row for each hook,
the TRL classes the row names, and the trainer arguments the spec `train` decides for the method: nothing the
installed TRL config does not take."""

from __future__ import annotations

import pytest

from fsdp_tune.config.methods import ROWS
from tests.conftest import spec_for

LORA = ["--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--use_peft_lora", "--output_dir", "/tmp/m"]


def test_every_row_has_a_hook_and_every_hook_a_row() -> None:
    from fsdp_tune.worker.training.methods import hooks

    assert set(hooks()) == set(ROWS)  # each entry's hook module (worker/methods/<name>.py) is there


@pytest.mark.parametrize("name", list(ROWS))
def test_the_hook_runs_the_rows_classes_on_the_decided_spec(name: str, tmp_path) -> None:
    import dataclasses

    from fsdp_tune.worker.training.methods import method_of
    from fsdp_tune.worker.training.spelling import installed_names

    needs = ["--reward_funcs", "length_reward"] if ROWS[name].generates else []  # a generating method's rewards
    spec = spec_for(*LORA, "--method", name, *needs, "--output_dir", str(tmp_path), "--use_cpu", "true")
    hook, row = method_of(spec)
    assert row is ROWS[name]
    assert hook.config_class.__name__ == row.config_class and hook.trainer_class.__name__ == row.trainer_class
    # SFT's rows are counted from their own lengths; a generating method's prompts are cut by rank 0 (none by TRL)
    assert (hook.sequences is None) == (row.data in ("sft", "prompts"))
    taken = {f.name for f in dataclasses.fields(hook.config_class)}
    handed = installed_names(spec.trainer_args.kwargs(), hook.config_class)  # as worker/training/config.py hands them
    assert set(handed) <= taken, set(handed) - taken


@pytest.mark.parametrize("name", list(ROWS))
def test_every_hooks_preparation_takes_what_the_recipe_passes(name: str) -> None:
    """The recipe calls `prepare(spec, tokenizer, processor)` for every method (worker/recipe.py prepare_data)."""
    import inspect

    from fsdp_tune.worker.training.methods import hook_of

    params = inspect.signature(hook_of(name).prepare).parameters
    assert list(params)[:3] == ["spec", "tokenizer", "processor"], list(params)
