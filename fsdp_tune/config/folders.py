"""What a model, tokenizer, processor or adapter folder may hold before any library opens it: the policy half of
the loader door (worker/loading/door.py holds the calls). Torch-free, so the launcher's checks
(`validate-config --adapter`, the pre-flight) and the ranks, `chat`, `merge` and a reward model read the same rules.

A folder handed over is data, not code and not a trusted file:
- code runs only on the opt-in: a folder whose config names its own classes (`auto_map` in config.json,
  tokenizer_config.json, processor_config.json or preprocessor_config.json) needs `trust_remote_code`; without it
  the folder is refused here, naming the file and the flag, before transformers could ask on stdin;
- a safetensors header is read through one bounded reader: its 8-byte length checked against the file's size and
  safetensors' own cap (100 MB), its JSON parsed with the parser's recursion bound caught, and its shape checked
  (a table of tensors, each with a known dtype, a shape of non-negative ints, two offsets);
- an adapter's config is bounded before PEFT sees it: its rank (PEFT allocates r x features per target), its
  scale, and `target_modules` as a regex (PEFT matches it against every module name with `re.fullmatch`; a
  regex that can backtrack without bound hangs there).
Anything refused is a FolderRefused (exit 2) naming the file.
"""

from __future__ import annotations

import json
import math
import re
import stat
from pathlib import Path
from typing import Any

from fsdp_tune.errors import UsageError

MAX_HEADER = 100_000_000  # safetensors' own cap on a header (safetensors/src/tensor.rs MAX_HEADER_SIZE)
MAX_JSON = 64 << 20  # a config or tokenizer_config.json (a tokenizer's added tokens make it a few MiB at most)
# The largest LoRA rank accepted: PEFT allocates r x (in + out) numbers per adapted layer, so r 1,000,000,000 asks for
# terabytes. 4096 is past any adapter in use (published ones stop at 1024) and at the width of a 4096-wide layer, where
# a rank stops adding anything (an update's rank is at most the layer's width). Not the base's own width: fsdp-tune
# trains a rank above it without a word (a tiny model, r 64), and what it trains must open again.
MAX_RANK = 4096
MAX_ALPHA = 1e6
MAX_REGEX = 4096  # characters in a regex target_modules / exclude_modules (decide/vision.py's alternations grow)
MAX_NAMES = 10_000  # entries in a target_modules list
MAX_FREE_REPEATS = 3  # unbounded quantifiers (*, +, {n,}) in one regex; none inside another quantifier
DTYPES = frozenset(
    "BOOL U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 F4 F6_E2M3 F6_E3M2 I16 U16 F16 BF16 I32 U32 F32 I64 U64 F64 C64".split()
)
# the files beside a model's config.json that may name code of the folder's (config.json itself: the model door's,
# sources/model.py, read once and passed in)
CODE_FILES = ("tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


class FolderRefused(UsageError):
    """A folder's file that is broken, hostile or needs code the user did not allow: exit 2, naming the file."""


def _regular(path: Path, cap: int) -> int:
    """The file's size; refused when it is not a regular file (a FIFO, a device) or larger than `cap`."""
    try:
        info = path.stat()
    except OSError as e:
        raise FolderRefused(f"{path}: cannot be read ({e.strerror or e})", "check the folder") from None
    if not stat.S_ISREG(info.st_mode):
        raise FolderRefused(f"{path}: not a regular file", "a model folder holds regular files")
    if info.st_size > cap:
        raise FolderRefused(f"{path}: {info.st_size:,} bytes, more than {cap:,}", "check the folder's files")
    return info.st_size


def _parse(path: Path, text: bytes | str) -> Any:
    """JSON, with its parser's recursion bound as the depth bound (json's C parser raises RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise FolderRefused(f"{path}: JSON nested too deep", "the file is not what its name says") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise FolderRefused(f"{path}: not valid JSON ({str(e)[:120]})", "the file is not what its name says") from e


def read_json(path: Path) -> Any:
    """A folder's JSON file (config.json, adapter_config.json, tokenizer_config.json), bounded."""
    _regular(path, MAX_JSON)
    with path.open("rb") as f:
        return _parse(path, f.read(MAX_JSON + 1))


def read_header(path: Path) -> dict[str, dict]:
    """A safetensors file's header (tensor name -> {dtype, shape, data_offsets}; `__metadata__` dropped), read
    through the bounds above; FolderRefused naming the file when it is not a safetensors header."""
    size = _regular(path, 1 << 62)
    bad = "the file is not a safetensors file, or was cut short: copy or download it again"
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FolderRefused(f"{path}: {size} bytes, too short for a safetensors header", bad)
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER or length > size - 8:
            raise FolderRefused(
                f"{path}: its header claims {length:,} bytes (the file has {size:,}; safetensors allows "
                f"{MAX_HEADER:,})",
                bad,
            )
        table = _parse(path, f.read(length))
    if not isinstance(table, dict):
        raise FolderRefused(f"{path}: its header is not a table of tensors (JSON {type(table).__name__})", bad)
    tensors = {}
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        why = _entry_problem(entry)
        if why:
            raise FolderRefused(f"{path}: tensor {name[:80]!r} {why}", bad)
        tensors[name] = entry
    return tensors


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return f"is a {type(entry).__name__}, not an entry with dtype, shape and data_offsets"
    if entry.get("dtype") not in DTYPES:
        return f"has dtype {str(entry.get('dtype'))[:20]!r} (none that safetensors writes)"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) or len(shape) > 16:
        return f"has shape {str(shape)[:40]} (a list of sizes)"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets):
        return f"has data_offsets {str(offsets)[:40]} (two byte offsets)"
    return None


def tensor_names(path: Path) -> tuple[str, ...]:
    return tuple(read_header(path))


# --- code that comes with a folder -------------------------------------------------------------------------------


def code_configs(folder: Path, config: dict | None = None, config_name: str = "") -> dict[str, dict]:
    """{file name: its JSON} of the files of `folder` whose auto_map names classes of the folder's (or another
    repository's) own code; `config`: the folder's config.json as the model door read it, named `config_name`."""
    found = {config_name: config} if isinstance(config, dict) and config.get("auto_map") else {}
    for name in CODE_FILES:
        path = folder / name
        if path.is_file():
            data = read_json(path)
            if isinstance(data, dict) and data.get("auto_map"):
                found[name] = data
    return found


# --- an adapter, before PEFT ---------------------------------------------------------------------------------------


def check_adapter(folder: Path) -> dict:
    """adapter_config.json within bounds and the weights' header readable: the config, else FolderRefused."""
    path = folder / "adapter_config.json"
    config = read_json(path)
    if not isinstance(config, dict):
        raise FolderRefused(f"{path}: a {type(config).__name__}, not PEFT's adapter config", "a PEFT adapter folder")
    for problem in adapter_problems(config):
        raise FolderRefused(f"{path}: {problem}", "the adapter is broken or not what it claims: train it again")
    weights = folder / "adapter_model.safetensors"
    if weights.exists():
        read_header(weights)
    return config


def adapter_problems(config: dict) -> list[str]:
    """What in a PEFT adapter config is out of bounds (see the module's docstring)."""
    found = []
    why = f"at most {MAX_RANK}"
    ranks = [("r", config.get("r", 8))] + [
        (f"rank_pattern[{k!r}]", v) for k, v in _table(config.get("rank_pattern")).items()
    ]
    for key, r in ranks:
        if type(r) is not int or not 1 <= r <= MAX_RANK:
            found.append(f"{key} {str(r)[:30]}: a LoRA rank is a whole number from 1, {why}")
    alphas = [("lora_alpha", config.get("lora_alpha", 8))] + [
        (f"alpha_pattern[{k!r}]", v) for k, v in _table(config.get("alpha_pattern")).items()
    ]
    for key, a in alphas:
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or abs(a) > MAX_ALPHA:
            found.append(f"{key} {str(a)[:30]}: a finite number up to {MAX_ALPHA:g}")
    dropout = config.get("lora_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        found.append(f"lora_dropout {str(dropout)[:30]}: from 0 up to 1")
    for key in ("target_modules", "exclude_modules", "modules_to_save"):
        found += _names_problems(key, config.get(key))
    for key in ("rank_pattern", "alpha_pattern"):  # PEFT matches their keys as regexes too
        found += [p for k in _table(config.get(key)) for p in _names_problems(f"{key} key", k)]
    return found


def _table(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _names_problems(key: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        why = regex_problem(value)
        return [f"{key} {value[:60]!r}: {why}"] if why else []
    if not isinstance(value, list) or len(value) > MAX_NAMES:
        return [f"{key}: a list of at most {MAX_NAMES:,} module names, or one regex"]
    long = [v for v in value if not isinstance(v, str) or len(v) > MAX_REGEX]
    return [f"{key}: {str(long[0])[:60]!r} is not a module name"] if long else []


def regex_problem(pattern: str) -> str | None:
    """Why a target_modules regex is refused: too long, not a regex, or able to backtrack without bound. The rule
    (sound, if stricter than needed): no quantifier inside another quantifier (`(a+)+`, `(.*.*)*`), no alternation
    inside a repeating quantifier (`(a|a)*`), at most MAX_FREE_REPEATS unbounded quantifiers in a row, the worst
    branch of an alternation counting (`.*` k times in a row costs n^k on an n-character name; branches are tried
    one after another). Every regex PEFT's docs and fsdp-tune write passes
    (`.*\\.(q_proj|v_proj)`, `model\\.layers\\.\\d+\\.self_attn\\.(q|k|v)_proj`)."""
    if len(pattern) > MAX_REGEX:
        return f"{len(pattern)} characters: at most {MAX_REGEX}"
    try:
        parsed = _sre_parse(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        return f"not a regular expression ({e})"
    free = _walk(parsed, inside=False)
    if free is None:
        return "a quantifier inside a quantifier (or an alternation inside one) can backtrack without bound"
    if free > MAX_FREE_REPEATS:
        return f"{free} unbounded quantifiers: at most {MAX_FREE_REPEATS} (each multiplies the matching time)"
    return None


def _sre_parse(pattern: str):
    try:
        from re import _parser as parser  # Python 3.11+
    except ImportError:  # pragma: no cover - 3.10
        import sre_parse as parser  # type: ignore[no-redef]
    return parser.parse(pattern)


def _walk(items, inside: bool) -> int | None:
    """Unbounded quantifiers in `items` (a parsed regex), or None for a nesting that can backtrack without bound.
    `inside`: within a quantifier that repeats (more than once); `?` does not repeat."""
    from re import _constants as c

    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT))
    total = 0
    for op, arg in items:
        if op in repeats:
            low, high, body = arg
            repeats_more = high > 1 and high != low
            if inside and repeats_more:
                return None
            total += high > 100  # `{0,100000}` costs what `*` costs
            subs, now_inside = [body], inside or high > 1
        elif op == c.BRANCH:  # the branches are tried one after another: their costs add, the worst one counts
            if inside:
                return None
            found = [_walk(sub, inside) for sub in arg[1]]
            if any(f is None for f in found):
                return None
            total += max(found, default=0)
            continue
        elif op == c.SUBPATTERN:
            subs, now_inside = [arg[-1]], inside
        elif op in (c.ASSERT, c.ASSERT_NOT):
            subs, now_inside = [arg[1]], inside
        elif op == c.GROUPREF_EXISTS:
            subs, now_inside = [s for s in arg[1:] if s is not None], inside
        else:
            continue
        for sub in subs:
            found = _walk(sub, now_inside)
            if found is None:
                return None
            total += found
    return total
