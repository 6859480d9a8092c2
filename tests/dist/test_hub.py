"""--push_to_hub, offline: the Hub is a folder (FSDP_TUNE_TEST_FAKE_HUB, worker/faults.py) that records the calls
the Trainer and fsdp-tune make. The repository honours --hub_model_id and --hub_private_repo, --hub_strategy
every_save pushes the whole adapter at each save (a SHARDED checkpoint holds none by itself), and the final push
carries the checked adapter and tokenizer, never the run's bookkeeping."""

from __future__ import annotations

import json

from safetensors.torch import load_file


def test_push_to_hub(train, tmp_path) -> None:
    hub = tmp_path / "hub"
    run = train(
        *("--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", "--push_to_hub"),
        *("--hub_model_id", "me/tiny-adapter", "--hub_private_repo", "True", "--hub_strategy", "every_save"),
        env={
            "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "0",
            "HF_TOKEN": "not-a-real-token",
            "FSDP_TUNE_TEST_FAKE_HUB": str(hub),
        },
    )
    calls = [json.loads(line) for line in (hub / "calls.jsonl").read_text().splitlines()]
    assert calls[0] == {"call": "create_repo", "repo_id": "me/tiny-adapter", "private": True, "exist_ok": True}
    uploads = [c for c in calls if c["call"] == "upload_folder"]
    assert [u["message"] for u in uploads] == [
        "Training in progress, step 2",
        "Training in progress, step 4",
        "End of training (fsdp-tune: adapter checked)",
    ]
    for upload in uploads:
        assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= set(upload["files"])
        assert not [f for f in upload["files"] if f.startswith(("logs/", "fsdp_tune_", "metrics", "checkpoint-"))]
    pushed = load_file(str(hub / "me/tiny-adapter" / "adapter_model.safetensors"))
    final = load_file(str(run.output_dir / "adapter_model.safetensors"))
    assert pushed.keys() == final.keys() and all((pushed[k] == final[k]).all() for k in final)
    assert "pushed the adapter to me/tiny-adapter" in run.proc.stdout
