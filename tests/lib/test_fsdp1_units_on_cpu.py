"""FSDP1's unit-by-unit save and reload (worker/saving/fsdp1_units.py) on a real FSDP1 model: NO_SHARD in one CPU
process over gloo, as accelerate wraps a PEFT model (tests/lib/fsdp1_driver.py). And what it replaces at FULL
checkpoints: accelerate's save_fsdp_model takes FSDP1's full state dict, a copy of every weight of the model, to
keep the adapter's (RankSpec.save.checkpoint = "adapter_file" skips it)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_fsdp1_adapter_save_and_reload_unit_by_unit_and_what_accelerate_would_gather() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.lib.fsdp1_driver"], cwd=REPO, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["units"] > 2  # the layers and the LoRA modules in units of their own, as accelerate wraps them
    # unit by unit: every adapter tensor, with the model's values, and nothing else
    assert found["gathered"] == found["adapter_tensors"] == 28 and found["gathered_equals_adapter"]
    assert found["loaded"] == 28 and found["round_trip"]  # resume: written back through each unit
    # accelerate's FULL_STATE_DICT save: the whole model copied (49 tensors, the base weights with them), 14 times
    # the adapter's bytes for this tiny model, ~100x for an 8B one
    assert found["accelerate_state_dict_keys"] == 49 and found["accelerate_copies"] == 49
    assert found["accelerate_state_dict_mib"] == found["whole_model_mib"] > 10 * found["adapter_mib"]
