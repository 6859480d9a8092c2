"""Test-only fault injection, in one place: production code asks this module, tests set the variables.

FSDP_TUNE_TEST_KILL="RANK:STEP"   SIGKILL that rank at the end of that step (first torchrun attempt only)
FSDP_TUNE_TEST_HANG="RANK:STEP"   make that rank stop responding there instead
FSDP_TUNE_TEST_POISON_STEP=N      the loss of step N becomes NaN (the NaN guard's test)
FSDP_TUNE_TEST_FAKE_HUB=DIR       the Hub is a folder: repositories are created and uploaded into DIR, and
                                  every call is recorded in DIR/calls.jsonl (--push_to_hub's test, offline)
FSDP_TUNE_TEST_SHORT_GENERATION="RANK:N"  that rank's completions end after N tokens (GRPO: ranks finish apart)
FSDP_TUNE_TEST_UNMANAGED=NAME     a trainable parameter FSDP does not manage joins the sharded model of the run
                                  whose folder is NAME ("*": any), as an adapter added after sharding would: never
                                  reduced, its copies drift apart (the self-check's test)
FSDP_TUNE_TEST_COPIED_EXPERTS=NAME  under expert parallelism, every rank's experts become the first expert-parallel
                                  rank's (transformers#45662's wrong mesh) in the run whose folder is NAME ("*": any)
Nothing here acts unless one of these is set.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import transformers.trainer as trainer_module
from transformers import TrainerCallback

from fsdp_tune.worker.rank import rank, restart_count

KILL, HANG, POISON = "FSDP_TUNE_TEST_KILL", "FSDP_TUNE_TEST_HANG", "FSDP_TUNE_TEST_POISON_STEP"
SHORT = "FSDP_TUNE_TEST_SHORT_GENERATION"
UNMANAGED = "FSDP_TUNE_TEST_UNMANAGED"
COPIED_EXPERTS = "FSDP_TUNE_TEST_COPIED_EXPERTS"
FAKE_HUB = "FSDP_TUNE_TEST_FAKE_HUB"


def install_fake_hub() -> None:
    """Point transformers' Hub client (transformers.trainer.hf_api) at a folder, when the test asks."""
    folder = os.environ.get(FAKE_HUB)
    if folder:
        trainer_module.hf_api = lambda: FakeHub(folder)


class FakeHub:
    """The two HfApi calls the Trainer makes, against a folder (the same arguments, recorded)."""

    def __init__(self, folder: str):
        self.root = Path(folder)

    def _record(self, call: str, **kwargs) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "calls.jsonl", "a") as f:
            f.write(json.dumps({"call": call, **{k: v for k, v in kwargs.items() if k != "token"}}, default=str) + "\n")

    def create_repo(self, repo_id: str, token=None, private=None, exist_ok=False, **kwargs):
        full = repo_id if "/" in repo_id else f"fake-user/{repo_id}"
        self._record("create_repo", repo_id=full, private=private, exist_ok=exist_ok)
        return SimpleNamespace(repo_id=full)

    def upload_folder(self, repo_id, folder_path, path_in_repo=None, ignore_patterns=(), run_as_future=False, **kw):
        source = Path(folder_path)
        target = self.root / repo_id / (path_in_repo or "")
        files = []
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            rel = path.relative_to(source).as_posix()
            if any(fnmatch.fnmatch(rel, pattern) for pattern in ignore_patterns or ()):
                continue
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target / rel)
            files.append(rel)
        self._record(
            "upload_folder", repo_id=repo_id, path_in_repo=path_in_repo, files=files, message=kw.get("commit_message")
        )
        if run_as_future:
            done: Future = Future()
            done.set_result(None)
            return done
        return f"fake://{repo_id}"


def callbacks() -> list[TrainerCallback]:
    return [FaultInjectionCallback()] if os.environ.get(KILL) or os.environ.get(HANG) else []


def poison_loss(loss, next_step: int):
    """NaN instead of the loss at the step FSDP_TUNE_TEST_POISON_STEP names; the loss itself otherwise."""
    wanted = os.environ.get(POISON)
    if wanted and int(wanted) == next_step:
        return loss * float("nan")
    return loss


def shorten_generation(model) -> None:
    """FSDP_TUNE_TEST_SHORT_GENERATION: that rank's generate() stops after N new tokens, so its ranks finish
    decoding at different steps (what EOS does in a real run), which left unsynced ranks hanging in FSDP2."""
    wanted = os.environ.get(SHORT)
    if not wanted:
        return
    at_rank, n = (int(v) for v in wanted.split(":"))
    if rank() != at_rank:
        return
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    original = target.generate

    def generate(*args, **kwargs):
        kwargs["max_new_tokens"] = n
        return original(*args, **kwargs)

    target.generate = generate


def unmanaged_parameter(model, output_dir: str) -> None:
    """FSDP_TUNE_TEST_UNMANAGED: a zero bias added to the first decoder layer's output, a plain trainable parameter
    registered after fully_shard (so in no FSDP parameter group). Each rank's gradient for it is its own."""
    wanted = os.environ.get(UNMANAGED)
    if not wanted or wanted not in ("*", Path(output_dir).name):
        return
    import torch

    layer = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer"))
    size = model.get_input_embeddings().weight.shape[-1]
    layer.register_parameter("fsdp_tune_test_bias", torch.nn.Parameter(torch.zeros(size)))

    def add(module, args, out):
        if isinstance(out, tuple):
            return (out[0] + module.fsdp_tune_test_bias, *out[1:])
        return out + module.fsdp_tune_test_bias

    layer.register_forward_hook(add)


def copied_experts(model, output_dir: str) -> None:
    """FSDP_TUNE_TEST_COPIED_EXPERTS: each expert-parallel parameter's local slice overwritten by the first
    expert-parallel rank's (a broadcast over the "ep" mesh dimension)."""
    wanted = os.environ.get(COPIED_EXPERTS)
    if not wanted or wanted not in ("*", Path(output_dir).name):
        return
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p, DTensor) and "ep" in (p.device_mesh.mesh_dim_names or ()):
            group = p.device_mesh.get_group("ep")
            with torch.no_grad():
                dist.broadcast(p.to_local(), src=dist.get_global_rank(group, 0), group=group)


class FaultInjectionCallback(TrainerCallback):
    def __init__(self):
        self.kill = self._where(os.environ.get(KILL, ""))
        self.hang = self._where(os.environ.get(HANG, ""))

    @staticmethod
    def _where(value: str) -> tuple[int, int]:
        """RANK:STEP -> (rank, step); (-1, -1) when not set."""
        at_rank, step = value.split(":") if value else (-1, -1)
        return int(at_rank), int(step)

    def on_step_end(self, args, state, control, **kwargs):
        here = (rank(), state.global_step)
        if restart_count():
            return
        if here == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if here == self.hang:
            time.sleep(3600)
