"""A local model folder, checked before any rank starts, without torch: a config.json that parses and names a
model type the installed transformers knows, tokenizer files, and weights whose shapes agree with config.json
(read from the safetensors headers). Each of these otherwise fails on every rank after launch, with a traceback.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import re
from pathlib import Path

from fsdp_tune.config.folders import code_configs
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.sources.model import CONFIG, ModelFacts, model_facts

# Any of these makes a tokenizer AutoTokenizer can load (fast JSON, sentencepiece, BPE/WordPiece vocabularies, tiktoken)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "merges.txt")
# Families whose checkpoints use Llama's tensor names and shapes (the ones CI trains, and their relatives): the
# shape check speaks only for these; other layouts (fused qkv, MLA attention, Conv1D) are left to the ranks.
LLAMA_LAYOUT = frozenset(
    "llama mistral qwen2 qwen3 gemma gemma2 gemma3_text mixtral qwen2_moe qwen3_moe olmo olmo2 granite".split()
)
_KEY = "--model_name_or_path"
_RESTORE = "restore the config.json the model came with"


def _error(rule: str, message: str, hint: str) -> Finding:
    return Finding(rule, Severity.ERROR, _KEY, "command line", message, hint)


def check_model_folder(
    folder: Path, name: str, trust_remote_code: bool, shapes: bool = True, facts: ModelFacts | None = None
) -> list[Finding]:
    """PF005 config.json, PF006 tokenizer, PF007 shapes (`shapes`: the weights files are whole): the first
    problem of each kind, one line each. `facts`: the folder as the model door found it (the rank spec's
    `ModelSpec.facts`; else the door is asked)."""
    config, found = _config(facts or model_facts(str(folder)), trust_remote_code)
    if not any((folder / f).is_file() for f in TOKENIZER_FILES) and not list(folder.glob("*.tiktoken")):
        found.append(
            _error(
                "PF006",
                f"{name} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): every rank would fail "
                "loading the tokenizer",
                "copy the tokenizer files of the model beside its weights (tokenizer.save_pretrained(FOLDER))",
            )
        )
    if config is not None and shapes:
        found += _shapes(folder, name, config)
    return found


def _config(facts: ModelFacts, trust_remote_code: bool) -> tuple[dict | None, list[Finding]]:
    path, config = facts.config_file, facts.config
    if facts.problem or config is None:
        hint = "check the file's permissions" if (facts.problem or "").startswith("cannot") else _RESTORE
        return None, [_error("PF005", f"{path} {facts.problem or 'is missing'}", hint)]
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return None, [_error("PF005", f"{path} has no model_type", _RESTORE)]
    known = known_model_types()
    remote = trust_remote_code and isinstance(config.get("auto_map"), dict)
    if known and model_type not in known and not remote:
        closest = difflib.get_close_matches(model_type, known, n=1)
        hint = f"did you mean model_type {closest[0]!r}? " if closest else ""
        if isinstance(config.get("auto_map"), dict):
            hint += "the folder ships its own code: --trust_remote_code true runs it (FT083)"
        else:
            hint += "a newer transformers may know it (fsdp-tune env shows the installed one)"
        return None, [
            _error("PF005", f"{path}: model_type {model_type!r} is not one the installed transformers knows", hint)
        ]
    return config, []


@functools.cache
def known_model_types() -> frozenset[str]:
    """transformers' CONFIG_MAPPING_NAMES keys, read from the text of its auto modules (no import); empty when
    the layout is not recognised (the check is then skipped, never guessed)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    auto = Path(list(spec.submodule_search_locations)[0]) / "models" / "auto"
    names: set[str] = set()
    for file in ("auto_mappings.py", "configuration_auto.py"):
        try:
            text = (auto / file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        names.update(re.findall(r"\(\s*\"([\w-]+)\",\s*\"\w+Config\"\s*\)", text))
        names.update(re.findall(r"\"([\w-]+)\":\s*\"\w+Config\"", text))
    return frozenset(names) if len(names) > 50 else frozenset()


def _expected(config: dict) -> dict[str, tuple[int, int]]:
    """Tensor-name suffix -> the [rows, columns] config.json implies, Llama's layout."""
    hidden, inter, vocab = config.get("hidden_size"), config.get("intermediate_size"), config.get("vocab_size")
    heads = config.get("num_attention_heads")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, inter, vocab, heads)):
        return {}
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    return {
        "embed_tokens.weight": (vocab, hidden),
        "lm_head.weight": (vocab, hidden),
        ".self_attn.q_proj.weight": (heads * head_dim, hidden),
        ".self_attn.k_proj.weight": (kv * head_dim, hidden),
        ".self_attn.v_proj.weight": (kv * head_dim, hidden),
        ".self_attn.o_proj.weight": (hidden, heads * head_dim),
        ".mlp.gate_proj.weight": (inter, hidden),
        ".mlp.up_proj.weight": (inter, hidden),
        ".mlp.down_proj.weight": (hidden, inter),
    }


def _shapes(folder: Path, name: str, config: dict) -> list[Finding]:
    """PF007: a tensor whose shape is not what config.json says (an edited or swapped config.json): from_pretrained
    would refuse it on every rank after launch ("ignore_mismatched_sizes")."""
    if config.get("model_type") not in LLAMA_LAYOUT or config.get("quantization_config"):
        return []
    expected = _expected(config)
    wrong = []
    for file in sorted(folder.glob("*.safetensors")):
        for tensor, shape in _header_shapes(file).items():
            want = next((s for suffix, s in expected.items() if tensor.endswith(suffix)), None)
            if want is not None and tuple(shape) != want:
                wrong.append((file.name, tensor, shape, want))
    if not wrong:
        return []
    file, tensor, shape, want = wrong[0]
    more = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
    return [
        _error(
            "PF007",
            f"{name}: config.json and the weights disagree: {tensor} is {list(shape)} in {file}, config.json makes "
            f"it {list(want)}{more}",
            "config.json is not the one these weights were saved with: restore it (or the weights that go with it)",
        )
    ]


def _header_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from a safetensors header (8 bytes of length, then a JSON table); {} if unreadable
    (sources/weights.py reports a broken file)."""
    try:
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if length > 100 * 2**20:
                return {}
            table = json.loads(f.read(length))
    except (OSError, ValueError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {k: v.get("shape", []) for k, v in table.items() if k != "__metadata__" and isinstance(v, dict)}


def native_classes(file: str, data: dict) -> bool:
    """Whether transformers has its own classes for what `file` describes (then trust_remote_code=False loads
    those, and the auto_map's code is not needed). Read without importing torch: the model types from the text of
    transformers' auto mappings, class names from its lazy module's listing."""
    import transformers

    if file == CONFIG:
        return data.get("model_type") in known_model_types()
    named = data.get("tokenizer_class") or data.get("processor_class") or data.get("image_processor_type")
    return isinstance(named, str) and named.removesuffix("Fast") in dir(transformers)


def code_asked(folder: Path, facts: ModelFacts) -> list[str]:
    """The files of `folder` (config.json, the tokenizer's, the processor's) whose auto_map names code transformers
    has no class of its own for: what loading it without trust_remote_code refuses (worker/loading/door.py
    prepared on the ranks, chat and merge; the reward pre-flight before launch). `facts`: the model door's."""
    return [f for f, data in code_configs(folder, facts.config, CONFIG).items() if not native_classes(f, data)]
