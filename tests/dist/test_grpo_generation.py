"""GRPO's generation gathered once per generation against today's path (every unit all-gathered per token), on 2 CPU
ranks in one small torchrun launch (tests/dist/generation_driver.py: a sharded tiny Llama with a non-zero LoRA, no
trainer): greedy completions equal, the gathers counted, the ranks finishing decoding apart (in step on today's path,
each on its own gathered), and training after it with FSDP's settings as they were. The whole GRPO run on the
gathered path is tests/dist/test_grpo.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO
from tests.dist.conftest import TIMEOUT


def test_greedy_completions_are_the_same_gathered_once_or_per_token(tmp_path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(REPO / "tests" / "dist" / "generation_driver.py"), str(tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{k}.json").read_text()) for k in (0, 1)]
    for rank in ranks:
        assert rank["equal"], ranks  # the same tokens, rank by rank, on both paths (and twice gathered)
        # 6 units: the embedding, 3 layers, [norm, lm_head] and the root. Per token: the embedding and the 3 layers
        # again at each of the 8 forwards (the tail and the root keep theirs after forward)
        assert rank["units"] == 6 and rank["per_token_gathers"] == 4 * 8, ranks
        # gathered: each unit at most once per generation (the first finds the tail and the root still gathered)
        assert rank["gathered_gathers"] == [4, 6], ranks
        assert rank["resharded"] and rank["layer_reshards_after_forward"] and rank["grads"], ranks
        assert rank["generations_timed"] == 2, ranks
    # rank 1 stopped after 3 new tokens, rank 0 went on to 8; today's path kept rank 1 stepping (the same gathers, no
    # hang); gathered, each rank ran only its own forwards (no collective inside the phase to wait on)
    assert [r["new_tokens"] for r in ranks] == [8, 3], ranks
    assert [r["gathered_forwards"] for r in ranks] == [8, 3], ranks
