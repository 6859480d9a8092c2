"""The trainer's arguments in the installed transformers' spelling (no torch: the GPU check's probe and its unit
test call it too)."""

from __future__ import annotations


def installed_names(args: dict, config_class) -> dict:
    """The spec's trainer arguments in the installed transformers' spelling: the spec uses transformers 5.24's
    `activation_checkpointing[_kwargs]`, which earlier 5.x releases (5.17 included) call `gradient_checkpointing`
    (the same setting: Trainer calls gradient_checkpointing_enable with the kwargs). Any other argument the
    installed SFTConfig lacks is named here, with the versions, rather than as a TypeError from its __init__."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config_class)}
    if "activation_checkpointing" not in fields:
        for new, old in (
            ("activation_checkpointing", "gradient_checkpointing"),
            ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"),
        ):
            if new in args:
                args[old] = args.pop(new)
    unknown = sorted(k for k in args if k not in fields)
    if unknown:
        from importlib.metadata import version

        raise TypeError(
            f"{config_class.__name__} of trl {version('trl')} / transformers {version('transformers')} takes no "
            f"{', '.join(unknown)}: install the versions in constraints.txt"
        )
    return args
