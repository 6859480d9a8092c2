"""Every name TRL's `--config` file may hold for its scripts (TrlParser over ScriptArguments, ModelConfig,
DatasetMixtureConfig and each method's config, in the installed TRL) is read by fsdp-tune: a flag, or a name said to
be dropped or refused (FT012, FT017). A TRL release that adds a script argument fails here until a row speaks for it."""

from __future__ import annotations

import dataclasses

from fsdp_tune.config import keys
from fsdp_tune.config.names import flag_table


def test_every_trl_script_argument_is_read_or_said() -> None:
    from trl import (
        DatasetMixtureConfig,
        DPOConfig,
        GRPOConfig,
        KTOConfig,
        ModelConfig,
        RewardConfig,
        ScriptArguments,
        SFTConfig,
    )

    known = {*flag_table(), *keys.RETIRED_ARGS, *keys.TRL_SCRIPT_ONLY, keys.TRL_ENV_KEY}
    classes = (ScriptArguments, ModelConfig, DatasetMixtureConfig, SFTConfig, DPOConfig, KTOConfig, RewardConfig)
    classes += (GRPOConfig,)
    missing = {c.__name__: sorted(f.name for f in dataclasses.fields(c) if f.name not in known) for c in classes}
    assert not any(missing.values()), missing
