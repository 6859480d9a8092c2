"""`fsdp-tune export RUN/checkpoint-N`: a sharded checkpoint's adapter as a PEFT adapter, read from the reference run
(6 steps, a SHARDED_STATE_DICT checkpoint every 2): no launch of its own, one process."""

from __future__ import annotations

import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.runfiles import ADAPTER_WEIGHTS


def test_export_gives_each_checkpoint_its_adapter(reference_run, tmp_path) -> None:
    run = reference_run.output_dir  # read only: the exports go to tmp_path
    final = load_file(str(run / ADAPTER_WEIGHTS))
    runner = CliRunner()
    exported = {}
    for step in (2, 6):
        out = tmp_path / f"step-{step}"
        r = runner.invoke(app, ["export", str(run / f"checkpoint-{step}"), "-o", str(out)])
        assert r.exit_code == 0, r.output
        assert f"exported step {step}'s adapter (56 tensors)" in r.output and f"fsdp-tune chat {out}" in r.output
        exported[step] = load_file(str(out / ADAPTER_WEIGHTS))
        assert set(exported[step]) == set(final)  # the final adapter's keys (saving/save.py peft_keys), no more
        assert all(exported[step][k].dtype == final[k].dtype for k in final)
    # the last step is a checkpoint: its adapter is the final one, bit for bit; step 2's is an earlier one
    assert all(torch.equal(exported[6][k], final[k]) for k in final)
    assert any(not torch.equal(exported[2][k], final[k]) for k in final)
    # an export does not replace one without --force; with it, it does
    again = runner.invoke(app, ["export", str(run / "checkpoint-6"), "-o", str(tmp_path / "step-2")])
    assert again.exit_code == 2 and "exists and is not empty" in again.output
    again = runner.invoke(app, ["export", str(run / "checkpoint-6"), "-o", str(tmp_path / "step-2"), "--force"])
    assert again.exit_code == 0, again.output
    assert all(torch.equal(load_file(str(tmp_path / "step-2" / ADAPTER_WEIGHTS))[k], final[k]) for k in final)

    # chat takes the folder as it takes the run: the run's base, dtype
    # and chat template, and the checkpoint's weights in the model
    from fsdp_tune.tools.chat import answer, load

    out = tmp_path / "step-4"
    assert runner.invoke(app, ["export", str(run / "checkpoint-4"), "-o", str(out)]).exit_code == 0
    chat = load(str(out), device="cpu")
    assert f"+ adapter {out}, its chat template" in chat.described and "(float32)" in chat.described
    step4 = load_file(str(out / ADAPTER_WEIGHTS))
    params = dict(chat.model.named_parameters())
    for key, tensor in step4.items():
        assert torch.equal(params[key.replace(".weight", ".default.weight")].detach(), tensor), key
    assert isinstance(answer(chat, [{"role": "user", "content": "Hi"}], 4, 0.0, stream=False), str)

    # merge takes it too: its base found from the run's records, its logits checked against base + step 4's adapter
    from fsdp_tune.tools.merge import merge

    merged = merge(str(out), None, str(tmp_path / "step-4-merged"), "fp32", "5GB", "cpu", False)
    assert merged["max_rel_logit_diff"] <= merged["tolerance"] and merged["into"] == "base"
