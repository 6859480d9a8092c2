"""Every architecture family trains under FSDP2 on 2 CPU ranks, with LoRA and (where bitsandbytes allows) QLoRA,
and its adapter is whole: it reloads onto its base outside FSDP, gives the logits the sharded model gave, and
`merge` matches base + adapter (one dense and one MoE family).

One torchrun launch of tests/dist/arch_driver.py runs every family in turn in one process group (starting
torch and a process group per family would cost more than the training); each rank spec is decided here by
fsdp-tune's own validate + decide, from the test fixture's recipe plus per-family flags.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.dist.conftest import BASE, launch_driver
from tests.dist.families import build_all

QLORA = ["--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "float32"]  # fp32 storage follows the dtype


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    flags: list[str] = field(default_factory=list)
    reload_into_fsdp: bool = False  # resume's path: the saved adapter loaded back into the sharded model
    attention: str = "sdpa"
    quantized: bool = False


CASES = [
    # LoRA options spread over the families: each run exercises the save/verify path of one more PEFT feature
    Case(
        "llama",
        "llama",
        ["--modules_to_save", "lm_head", "--use_rslora"],  # loads sharded: the lm_head copy filled on each rank
        reload_into_fsdp=True,
    ),
    Case(
        "mistral",
        "mistral",
        ["--lora_target_modules", "q_proj", "v_proj", "down_proj", "--layers_to_transform", "1", "--lora_bias", "true"]
        + ["--trainable_token_indices", "5", "6"],  # loads with from_pretrained (PEFT copies the rows)
        reload_into_fsdp=True,
    ),
    Case("qwen2", "qwen2", ["--bias", "all", "--exclude_modules", "down_proj", "--rank_pattern", '{"q_proj": 4}']),
    Case("qwen3", "qwen3", ["--use_dora", "True", "--init_lora_weights", "orthogonal"]),
    Case("gemma2", "gemma2", [], attention="eager"),  # no SDPA (softcapping): its default is eager
    Case("gemma3", "gemma3", ["--init_lora_weights", "gaussian"]),
    Case("phi3", "phi3"),
    Case("mixtral", "mixtral", reload_into_fsdp=True),  # all-linear: attention, experts and router
    Case(  # PEFT's default names: experts through parameter targeting, no router
        "qwen3_moe",
        "qwen3_moe",
        ["--lora_target_modules", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    Case("qwen2_tied", "qwen2_tied", ["--modules_to_save", "embed_tokens", "--ensure_weight_tying", "true"]),
    Case("llama-qlora", "llama", QLORA, quantized=True),
    Case("gemma2-qlora", "gemma2", QLORA, attention="eager", quantized=True),
    Case("mixtral-qlora", "mixtral", QLORA, quantized=True),
    Case("qwen2_tied-qlora", "qwen2_tied", QLORA, quantized=True),
]
if os.environ.get("FSDP_TUNE_ARCH_ALL_QLORA"):  # every family under QLoRA: outside CI's budget, run by hand
    _in_ci = {c.family for c in CASES if c.quantized}
    CASES += [
        Case(f"{c.family}-qlora", c.family, QLORA, attention=c.attention, quantized=True)
        for c in CASES
        if not c.quantized and c.family == c.name and c.family not in _in_ci
    ]
MERGED = ("llama", "mixtral")  # one dense, one MoE
TIMEOUT = int(os.environ.get("FSDP_TUNE_TEST_TIMEOUT", "600"))


def _config(case: Case, model_dir: Path, out: Path):
    from fsdp_tune.validate import check

    flags = ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", "2", *case.flags]
    checked = check(str(BASE), [*flags, "--ddp_timeout", "120"])
    assert not checked.errors, [str(f) for f in checked.findings]
    return checked.config


def _decide(case: Case, model_dir: Path, out: Path) -> Path:
    from fsdp_tune.decide.data import read_files
    from fsdp_tune.decide.machine import Machine
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.preflight.checks import check_data

    # as `train` plans it: the spec decided from the data files read once (located, detected), then checked
    cfg = _config(case, model_dir, out)
    files = read_files(cfg)
    spec = decide(cfg, Machine(cuda=False, gpus=0), files=files)
    _, problems = check_data(spec, files)
    assert not [p for p in problems if p.severity.value == "error"], problems
    assert spec.model.attn_implementation == case.attention, spec.model
    out.mkdir(parents=True)
    resolved = out / "arch_spec.json"
    resolved.write_text(json.dumps({"spec": spec.as_dict()}))
    return resolved


@pytest.fixture(scope="module")
def trained(model_cache, tmp_path_factory) -> dict:
    """Every case trained in one torchrun launch: name -> (result, model dir, output dir)."""
    models = build_all(model_cache)
    root = tmp_path_factory.mktemp("arch")
    runs, where = [], {}
    for case in CASES:
        out = root / case.name
        runs.append({"name": case.name, "resolved": str(_decide(case, models[case.family], out)), **case.__dict__})
        where[case.name] = (models[case.family], out)
    launch = launch_driver("arch", root, runs, {name: out for name, (_, out) in where.items()}, model_cache, TIMEOUT)
    results = launch.results
    failed = {n: r["error"][-3000:] for n, r in results.items() if r and "error" in r}
    assert launch.proc.returncode == 0 and not failed, f"{failed or ''}\n{launch.proc.stderr[-4000:]}\n{launch.logs}"
    return {name: (results[name], *where[name]) for name in where}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_family_trains_and_its_adapter_reloads(trained, case: Case) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tests.dist.arch_driver import PROMPT

    result, model_dir, out = trained[case.name]
    assert result["attention"] == case.attention
    # sharded loading wherever it applies (decide/loading.py): not MoE, DoRA or trainable tokens
    dense = case.family not in ("mixtral", "qwen3_moe")
    falls_back = {"--use_dora", "--trainable_token_indices"} & set(case.flags)
    assert result["loading"] == ("sharded" if dense and not falls_back else "transformers"), result["loading"]
    assert len(result["losses"]) == 2 and all(x == x for x in result["losses"]), result["losses"]
    assert result["adapter_check"]["ok"]
    assert sum(result["units"].values()) > 1, result["units"]  # sharded by decoder layer, not one unit
    if case.reload_into_fsdp:
        assert result["reloaded_into_fsdp"]
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = torch.tensor([PROMPT])
    with torch.no_grad():
        plain = base(input_ids=prompt).logits[0]
        model = PeftModel.from_pretrained(base, str(out)).eval()
        reloaded = model(input_ids=prompt).logits[0]
    sharded = torch.tensor(result["logits"])
    assert (reloaded - plain).abs().max() > 1e-3, "the adapter changes nothing"
    if not case.quantized:  # the 4-bit model's logits differ from the full-precision base's by its rounding
        assert torch.allclose(reloaded, sharded, atol=1e-4, rtol=1e-4), (reloaded - sharded).abs().max()


@pytest.mark.parametrize("name", MERGED)
def test_merge_matches_base_plus_adapter(trained, name: str, tmp_path) -> None:
    from fsdp_tune.tools.merge import merge

    _, model_dir, out = trained[name]
    result = merge(str(out), str(model_dir), str(tmp_path / "merged"), "fp32", "1GB", "cpu", force=False)
    assert result["max_rel_logit_diff"] <= result["tolerance"]


def test_moe_adapters_reach_the_experts(trained) -> None:
    """Mixtral's all-linear adapts attention, the fused experts (gate_up at 2r, as PEFT fuses w1 and w3) and the
    router; Qwen3-MoE's default names adapt the experts, not the router: as many values as the planner counts."""
    from safetensors import safe_open

    for name, experts, router in (("mixtral", True, True), ("qwen3_moe", True, False)):
        _, _, out = trained[name]
        with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
            keys = list(f.keys())
        assert any("experts" in k for k in keys) is experts, keys
        assert any(".gate." in k for k in keys) is router, keys
        config = json.loads((out / "adapter_config.json").read_text())
        assert config["lora_dropout"] == 0.0


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "mixtral-qlora", "phi3", "gemma2"])
def test_planner_counts_what_peft_trains(trained, name: str) -> None:
    """The planner's trainable count is the one PEFT trained under FSDP: on MoE models (experts through
    parameter targeting, gate_up at 2r, the router) as on dense ones (fused qkv_proj, tied embeddings)."""
    from fsdp_tune.planner.shape import measure
    from fsdp_tune.planner.weights import lora_params

    result, model_dir, out = trained[name]
    case = next(c for c in CASES if c.name == name)
    assert lora_params(_config(case, model_dir, out), measure(str(model_dir))) == result["trainable"]


def test_planner_holds_the_experts_lora_rebuilds(model_cache, tmp_path) -> None:
    """LoRA on fused experts rebuilds W + BA per MoE layer and the grouped matmul saves it for backward: what one
    training forward saves beyond attention-only LoRA is, within 10%, the planner's copy of every layer's experts."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from fsdp_tune.planner.adapters import expert_copy_bytes
    from fsdp_tune.planner.shape import measure
    from fsdp_tune.planner.stack import stack_of

    model_dir = build_all(model_cache)["mixtral"]

    def saved(targets) -> int:
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(target_modules=targets))
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages: dict[int, int] = {}

        def keep(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.tensor([[3, 17, 42, 99]])
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            model(input_ids=ids, labels=ids)
        return sum(n for ptr, n in storages.items() if ptr not in params)

    extra = saved("all-linear") - saved(["q_proj", "k_proj", "v_proj", "o_proj"])
    case = Case("mixtral", "mixtral", ["--gradient_checkpointing", "false"])
    cfg = _config(case, model_dir, tmp_path / "plan")
    shape = measure(str(model_dir))
    planned = shape.n_layers * expert_copy_bytes(cfg, shape, stack_of(cfg, on_cpu=True))
    assert planned == pytest.approx(extra, rel=0.1)
