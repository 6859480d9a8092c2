"""Every criterion of the GPU check fails on a doctored result (benchmarks/gpu_criteria.py, gpu_measures.py, the
resume's checkpoint check): each test takes a result that passes, changes the one thing its criterion is about,
and sees FAIL. No torch, no GPU."""

from __future__ import annotations

import copy

import pytest

from benchmarks import gpu_criteria as crit
from benchmarks import gpu_measures as meas
from benchmarks.gpu_kinds import checkpoint_files
from benchmarks.gpu_runs import add


def _run(path="sharded", decided="sharded", places=None, device="cuda", offload=True) -> tuple[dict, dict]:
    """(summary, resolved) of a run that passes every criterion."""
    places = places if places is not None else [{"cpu_pinned": 900.0}, {"cpu_pinned": 900.0}]
    summary = {
        "adapter_check": {"ok": True, "lora_tensors": 56},
        "per_rank": [{"peak_gpu_allocated_mib": 1024.0, "peak_rss_mib": 900.0}],
        "extra": {
            "loading": {"path": path, "tensors_read": 147, "per_rank": [{"params_mib_by_place": p} for p in places]}
        },
    }
    resolved = {
        "spec": {"device": device, "loading": {"path": decided, "transformers_fsdp_config": {"cpu_offload": offload}}}
    }
    return summary, resolved


def test_adapter_check_fails_on_a_broken_adapter() -> None:
    summary, _ = _run()
    assert crit.adapter_whole(summary)[0]
    summary["adapter_check"]["ok"] = False
    ok, line = crit.adapter_whole(summary)
    assert not ok and "BROKEN" in line
    assert not crit.adapter_whole({})[0]


@pytest.mark.parametrize("measured_mib,expected", [(1024 * 1.149, True), (1024 * 0.851, True), (1024 * 1.16, False)])
def test_memory_within_15_percent_of_the_plan(measured_mib: float, expected: bool) -> None:
    summary = {"per_rank": [{"peak_gpu_allocated_mib": measured_mib, "peak_rss_mib": 10.0}]}
    ok, line = crit.memory(summary, {"peak_allocated_gib": 1.0}, on_cpu=False)
    assert ok is expected and ("PASS" if expected else "FAIL") in line
    rss = {"per_rank": [{"peak_rss_mib": measured_mib}, {"peak_rss_mib": 1.0}]}
    assert crit.memory(rss, {"per_rank_host_peak_gib": 1.0}, on_cpu=True)[0] is expected  # the largest rank


def test_loading_fails_on_a_silent_fall_back_and_on_the_wrong_path() -> None:
    summary, resolved = _run()
    assert crit.loading(summary, resolved, "sharded")[0]
    fell = copy.deepcopy(summary)
    fell["extra"]["loading"].update(path="transformers", note="fell back on the ranks: no safetensors")
    ok, line = crit.loading(fell, resolved, "sharded")
    assert not ok and "fell back" in line
    decided_other = copy.deepcopy(resolved)
    decided_other["spec"]["loading"]["path"] = "transformers"
    assert not crit.loading(fell, decided_other, "sharded")[0]  # the rank did as told; told the wrong thing
    nothing = copy.deepcopy(summary)
    nothing["extra"]["loading"]["tensors_read"] = 0
    assert not crit.loading(nothing, resolved, None)[0]
    assert not crit.loading({}, resolved, None)[0]  # no record of what the rank did


def test_placement_fails_where_the_parameters_are_not_where_the_spec_put_them() -> None:
    summary, resolved = _run()
    ok, line = crit.placement(summary, resolved, asked_offload=True)
    assert ok and "100% pinned" in line
    on_gpu, _ = _run(places=[{"cpu_pinned": 900.0}, {"cuda": 900.0}])  # one rank kept its shards on the GPU
    assert not crit.placement(on_gpu, resolved, True)[0]
    partly, _ = _run(places=[{"cpu_pinned": 900.0, "cuda": 20.0}] * 2)  # 2% on the GPU
    assert not crit.placement(partly, resolved, True)[0]
    dropped = copy.deepcopy(resolved)
    dropped["spec"]["loading"]["transformers_fsdp_config"]["cpu_offload"] = False
    ok, line = crit.placement(summary, dropped, asked_offload=True)
    assert not ok and "spec does not offload" in line
    silent, _ = _run(places=[{}, {"cpu_pinned": 900.0}])
    assert not crit.placement(silent, resolved, True)[0]
    plain, plain_spec = _run(places=[{"cuda": 900.0}], offload=False)
    assert crit.placement(plain, plain_spec, False)[0]
    assert not crit.placement(summary, plain_spec, False)[0]  # host shards where the spec said GPU


def test_pair_losses_fail_beyond_the_stated_tolerance_and_on_other_lengths() -> None:
    base = [2.0, 1.9, 1.8, 1.7]
    ok, line = crit.same_losses([x * 1.01 for x in base], base, 0.02, "the flagship")
    assert ok and "tolerance 2e-02" in line
    assert not crit.same_losses([x * 1.03 for x in base], base, 0.02, "the flagship")[0]
    assert not crit.same_losses(base[:3], base, 0.02, "the flagship")[0]
    assert not crit.same_losses(base[:1], base[:1], 0.02, "the flagship")[0]  # one step compares nothing
    assert crit.same_losses(base, None, 0.02, "the flagship")[0] is None
    assert not crit.same_losses([x * (1 + 2e-3) for x in base], base, crit.REFERENCE_TOLERANCE, "the CPU run")[0]


def test_a_pair_of_one_path_twice_fails() -> None:
    assert crit.different_paths("transformers", "sharded", "the flagship")[0]
    assert not crit.different_paths("sharded", "sharded", "the flagship")[0]
    assert not crit.different_paths("transformers", None, "the flagship")[0]


def test_no_gpu_use_fails_on_a_rise_or_a_new_process_and_unmeasured_counts_as_failed() -> None:
    baseline = {"used_mib": 0.0, "apps": []}
    quiet = [{"used_mib": 0.0, "apps": []}, {"used_mib": 2.0, "apps": []}]
    assert crit.no_gpu_use(baseline, quiet)[0]
    ok, line = crit.no_gpu_use(baseline, [*quiet, {"used_mib": 520.0, "apps": []}])  # a CUDA context appeared
    assert not ok and "+520 MiB" in line
    assert not crit.no_gpu_use(baseline, [*quiet, {"used_mib": 0.0, "apps": ["4242, 0"]}])[0]
    unmeasured = crit.no_gpu_use({"used_mib": None, "apps": []}, [{"used_mib": None, "apps": []}])
    assert unmeasured[0] is None
    record = {"checks": {}, "lines": []}
    add(record, "no GPU memory used", unmeasured)
    assert record["checks"] == {"no GPU memory used": False}  # what cannot be measured has not passed


def test_throughput_fails_when_not_steady_or_too_short() -> None:
    rows = [{"step": i, "loss": 1.0, "time": 2.0 + 0.5 * i, "num_tokens": 8192 * i} for i in range(1, 16)]
    times = crit.step_times(rows, warmup=5)
    assert len(times) == 10 and times == pytest.approx([0.5] * 10)
    assert crit.steady(times, "cuda")[0]
    assert not crit.steady([*times[:-1], 2.0], "cuda")[0]  # a stall
    assert not crit.steady(times[:9], "cuda")[0]  # too few timed steps for a figure
    assert meas.tokens_per_s(rows, warmup=5) == pytest.approx(8192 / 0.5)


def test_mfu_is_4n_and_the_recompute_is_said_apart() -> None:
    got = meas.mfu(12_000.0, 8_030_261_248, True, 989.0, 1)
    assert got["mfu"] == pytest.approx(12_000 * 4 * 8_030_261_248 / 989e12)
    assert got["hardware"] == pytest.approx(got["mfu"] * 1.5)
    assert "4N FLOPs/token" in got["formula"] and "+2N" in got["formula"] and "989 TFLOP/s" in got["formula"]
    plain = meas.mfu(12_000.0, 8_030_261_248, False, 989.0, 1)
    assert plain["hardware"] == plain["mfu"] and "no recompute" in plain["formula"]
    assert meas.mfu(12_000.0, 8_030_261_248, True, None, 2)["mfu"] is None  # no GPU peak (CPU)
    nemo = meas.NEMO_LLAMA3_8B_LORA
    theirs = nemo["tokens_per_s"] * 4 * nemo["n_params"] / 989e12
    assert theirs == pytest.approx(0.405, abs=1e-3) and nemo["model_tflops"] / 989 == pytest.approx(0.406, abs=1e-3)
    lines = meas.nemo_comparison(12_473.0, theirs, "NVIDIA H200", {"seq": 4096, "micro_batch": 2, "lora_r": 16})
    assert "12,473 tok/s" in lines[0] and "1.00x theirs" in lines[1]


@pytest.mark.parametrize(
    "decided,files,expected",
    [
        ("adapter_file", ["adapter_model.safetensors"], True),
        ("adapter_file", ["adapter_model.safetensors", "pytorch_model_fsdp.bin"], False),  # the whole-model save ran
        ("adapter_file", [], False),
        ("accelerate", ["pytorch_model_fsdp.bin"], True),
        (None, ["adapter_model.safetensors"], False),  # a spec that does not say
    ],
)
def test_the_checkpoint_holds_what_the_spec_decided(tmp_path, decided, files, expected) -> None:
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("x")
    got = {"resolved": {"spec": {"save": {"checkpoint": decided}}}}
    assert checkpoint_files(tmp_path, 4, got)[0] is expected


def test_grpo_steps_fail_on_a_step_unscored_a_nan_reward_or_empty_completions() -> None:
    rows = [{"step": i, "reward": -0.3, "completions/mean_length": 16.0} for i in (1, 2, 3, 4)]
    assert crit.grpo_steps(rows, 4)[0]
    assert not crit.grpo_steps(rows[:3], 4)[0]  # a step that never scored
    nan = copy.deepcopy(rows)
    nan[2]["reward"] = float("nan")
    assert not crit.grpo_steps(nan, 4)[0]
    empty = copy.deepcopy(rows)
    empty[0]["completions/mean_length"] = 0.0
    ok, line = crit.grpo_steps(empty, 4)
    assert not ok and "FAIL" in line


def test_images_trained_fails_without_the_vision_path_images_or_finite_losses() -> None:
    summary = {"losses": [6.2, 6.1], "data": {"images": {"train": {"image_sequences": 12, "image_tokens": 64}}}}
    resolved = {"spec": {"model": {"vision": {"guard": "dummy_image"}}}}
    assert crit.images_trained(summary, resolved)[0]
    assert not crit.images_trained(summary, {"spec": {"model": {"vision": None}}})[0]  # trained as text
    no_images = copy.deepcopy(summary)
    no_images["data"]["images"]["train"] = {"image_sequences": 0, "image_tokens": 0}
    assert not crit.images_trained(no_images, resolved)[0]
    nan = {**summary, "losses": [6.2, float("nan")]}
    ok, line = crit.images_trained(nan, resolved)
    assert not ok and "NOT all finite" in line
