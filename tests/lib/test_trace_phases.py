"""Which phase of the step a moment of the trace belongs to does not depend on the order in which torch's ModTracker
hands over the modules running then (a set of names, ordered by the process's string hash seed): CI once traced a
405B model at 512 ranks at 210.7 GiB against a plan of 22.0 because layer 0's all-gather copy-out was counted in
its own backward at 4 layers and in layer 1's at 3 (PYTHONHASHSEED=3 repeats it), which the extrapolation to 126
layers multiplied by 123."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from fsdp_tune.validate import check
from tests.conftest import REPO

pytest.importorskip("torch")
pytestmark = pytest.mark.lib

LAYERS = [f"PeftModelForCausalLM.base_model.model.model.layers.{i}._checkpoint_wrapped_module" for i in range(3)]


@pytest.mark.parametrize("backward, reached", [(True, "first"), (False, "middle")])
def test_a_moment_between_two_layers_is_the_layer_the_pass_reached_in_either_order(backward, reached) -> None:
    """Backward descends the layers (layer 0 has started while layer 1's post-backward hook is still to fire);
    forward climbs them."""
    from fsdp_tune.trace.tracker import PhaseTracker

    phases = set()
    for parents in (LAYERS[:2], LAYERS[1::-1]):
        tracker = SimpleNamespace(
            step_phase="forward",
            _mod_tracker=SimpleNamespace(is_bw=backward, parents=parents),
            layer_index={name: i for i, name in enumerate(LAYERS)},
            n_layers=len(LAYERS),
            layers_seen={False: False, True: False},
            embed_name="PeftModelForCausalLM.base_model.model.model.embed_tokens",
        )
        phases.add(PhaseTracker.phase(tracker))
    assert phases == {f"{'backward' if backward else 'forward'}: {reached} layer"}


class _Descending(set):
    """A set of module names iterated in reverse order: layer 1 before layer 0 (one order a hash seed can give)."""

    def __iter__(self):
        return iter(sorted(set.__iter__(self), reverse=True))


def test_layer_0s_copy_out_is_in_its_own_backward_whatever_order_the_tracker_gives(tmp_path, monkeypatch) -> None:
    """Layers much larger than the embedding (as a 405B model's are), so layer 0's all-gather buffer, held while its
    parameters are copied out at the start of its backward, is that phase's peak; under the order that once put
    that moment in layer 1's phase the first layer's backward still holds it."""
    from torch.distributed._tools.mod_tracker import ModTracker

    from fsdp_tune.planner.shape import measure
    from fsdp_tune.trace import run

    def stored(self):
        return self.__dict__["_parents"]

    def store(self, names):
        self.__dict__["_parents"] = _Descending(names)

    monkeypatch.setattr(ModTracker, "parents", property(stored, store), raising=False)
    data = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 512}
    data.update(intermediate_size=8192, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=6)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, "tie_word_embeddings": False}))
    args = ["--model_name_or_path", str(path), "--num_processes", "4", "--bf16", "True", "--use_peft_lora", "True"]
    args += ["--lora_r", "8", "--lora_target_modules", "all-linear", "--per_device_train_batch_size", "1"]
    cfg = check(str(REPO / "configs" / "fsdp2.json"), [*args, "--max_seq_len", "64"]).config
    traced = run.trace_at(run.rank_spec(cfg), cfg, 3)
    _, categories = traced.peaks["backward: first layer"]
    layer_bytes = 2 * measure(str(path)).layer_params  # bf16, as FSDP's mixed precision gathers it
    assert categories["all-gather buffers"] >= layer_bytes, categories
