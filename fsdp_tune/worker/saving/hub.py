"""--push_to_hub: the final adapter goes to the Hub from rank 0, after the adapter check.

The Trainer creates the repository when it starts (`init_hf_repo`: --hub_model_id, --hub_private_repo) and
pushes on saves as --hub_strategy says (every_save, checkpoint, all_checkpoints: `_push_from_checkpoint`).
TRL's sft script then calls `trainer.push_to_hub()` at the end; that re-saves the model (a second gather
under FSDP) and uploads the whole output folder. fsdp-tune pushes the folder it has just saved and
verified instead, without the run's own bookkeeping (rank logs, metrics, manifests, checkpoints).
"""

from __future__ import annotations

import transformers.trainer as trainer_module

from fsdp_tune.worker.logs import console
from fsdp_tune.worker.rank import is_main

# Files of the output folder that are the run's bookkeeping, not the model: never uploaded
NOT_UPLOADED = ["_*", "checkpoint-*", "logs/*", "fsdp_tune_*", "metrics*.jsonl", "*.png", "*.tmp", ".*"]


def exclude_bookkeeping() -> None:
    """The Trainer's own pushes (on each save, --hub_strategy) upload the output folder with only `_*` and
    `checkpoint-*` left out: wrap its Hub client so the run's bookkeeping stays out of those too."""
    original = trainer_module.hf_api
    if getattr(original, "_fsdp_tune_filtered", False):
        return

    def hf_api():
        return _Filtered(original())

    hf_api._fsdp_tune_filtered = True  # type: ignore[attr-defined]
    trainer_module.hf_api = hf_api


class _Filtered:
    def __init__(self, api):
        self.api = api

    def __getattr__(self, name: str):
        return getattr(self.api, name)

    def upload_folder(self, *args, ignore_patterns=None, path_in_repo=None, **kwargs):
        if not path_in_repo:  # the output folder itself (a checkpoint pushed under its own path goes whole)
            ignore_patterns = [*(ignore_patterns or []), *NOT_UPLOADED]
        return self.api.upload_folder(*args, ignore_patterns=ignore_patterns, path_in_repo=path_in_repo, **kwargs)


def push_final(trainer, output_dir: str) -> str | None:
    """Upload the verified adapter (and tokenizer, model card) to the run's Hub repository; rank 0 only.
    Every rank calls it; returns the commit URL on rank 0."""
    if not is_main():
        return None
    args = trainer.args
    if trainer.hub_model_id is None:
        trainer.init_hf_repo()
    trainer.create_model_card(model_name=(args.hub_model_id or output_dir).rstrip("/").split("/")[-1])
    trainer._finish_current_push()  # the last save's push, if one is still uploading
    commit = trainer_module.hf_api().upload_folder(
        repo_id=trainer.hub_model_id,
        folder_path=output_dir,
        commit_message="End of training (fsdp-tune: adapter checked)",
        token=args.hub_token,
        ignore_patterns=NOT_UPLOADED,
        revision=args.hub_revision,
    )
    url = str(getattr(commit, "commit_url", commit))
    console().line(f"pushed the adapter to {trainer.hub_model_id} ({url})")
    return url


def pushes_on_save(args) -> bool:
    """The Trainer pushes at each save (--hub_strategy other than end): the saved checkpoint must then hold
    the whole adapter, which a SHARDED_STATE_DICT checkpoint does not on its own."""
    return bool(args.push_to_hub) and args.hub_strategy != "end"  # HubStrategy is a str enum
