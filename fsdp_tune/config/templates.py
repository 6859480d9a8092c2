"""Chat templates for `--chat_template_format` (the ones PEFT's examples/sft uses), as plain data; and every chat
template's render bounded in time and size (`rendering`)."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator

CHATML = {
    "bos_token": "<|im_start|>",
    "eos_token": "<|im_end|>",
    "pad_token": "<pad>",
    "additional_special_tokens": ["<|im_start|>user", "<|im_start|>assistant", "<|im_start|>system"],
    "template": (
        "{% for message in messages %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
}

ZEPHYR = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "</s>",
    "additional_special_tokens": ["<|user|>", "<|assistant|>", "<|system|>"],
    "template": (
        "{% for message in messages %}"
        "{% if message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + eos_token }}"
        "{% elif message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + eos_token }}"
        "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}"
        "{% endif %}"
        "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
        "{% endfor %}"
    ),
}

TEMPLATES = {"chatml": CHATML, "zephyr": ZEPHYR}

# ChatML with TRL's {% generation %} markers around each answer: what TRL's assistant_only_loss needs from a
# template. Not a --chat_template_format choice (fsdp-tune finds the answers without markers): the plain
# torchrun + SFTTrainer baseline (benchmarks/plain_sft.py) trains with it, and the tests check fsdp-tune's
# answer masks against the masks it gives.
CHATML_ANSWERS_MARKED = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def apply_template(tok, name: str | None):
    """`tok` with template `name` (--chat_template_format), as PEFT's examples set it up: only the special tokens
    the vocabulary lacks are added (a model that already speaks ChatML keeps its vocabulary, and its embeddings
    their size); a pad token when it has none. The ranks and the launcher's pre-flight tokenizer both use it."""
    template = TEMPLATES.get(name or "")
    if template is not None:
        missing = {
            k: template[k] for k in ("bos_token", "eos_token", "pad_token") if template[k] not in tok.get_vocab()
        }
        if missing:
            tok.add_special_tokens(missing)
        for k in ("bos_token", "eos_token", "pad_token"):
            setattr(tok, k, template[k])
        tok.chat_template = template["template"]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


# --- rendering a chat template with bounds ---------------------------------------------------------------------
# transformers renders chat templates in jinja2's ImmutableSandboxedEnvironment (no attribute access to Python's
# internals, `range` capped at 100,000 items), but the sandbox bounds neither time nor size: two nested loops
# render 10^10 times, `'x' * 10**10` and `10**10**10` are single operations. The bounds here:
# - time: the render runs under a SIGALRM timer (main thread, where the platform has one: the launcher's
#   pre-flight, `chat` and `merge` render there). The compiled template is Python code, so the alarm's exception
#   stops any loop; a thread cannot be stopped, and a subprocess per render would cost the pre-flight ~1 s a row.
# - size: `*`, `**` and `%` and the width-taking filters (center, indent, wordwrap, format) are checked before they
#   run against MAX_RENDER characters (and exponents against MAX_POWER bits); anything else grows only as fast as a
#   loop does, which the time bound stops.
MAX_RENDER = 16 << 20  # characters a rendered conversation (or any piece of it) may have
MAX_POWER = 4096  # bits in an integer a template computes with **
RENDER_SECONDS = 10.0


class TemplateRefused(Exception):
    """A chat template that broke a bound (time, size) or the sandbox's rules: a finding about the template."""


def template_fault(error: BaseException) -> TemplateRefused | None:
    """`error` as a fault of the template itself (a bound broken, jinja2's SecurityError), else None: what the
    rows' renderers (sources/masking.py, encode.py) pass on instead of skipping one row for it."""
    if isinstance(error, TemplateRefused):
        return error
    from jinja2.exceptions import SecurityError

    if isinstance(error, SecurityError):
        return TemplateRefused(f"the chat template breaks the sandbox's rules ({error})")
    return None


def _sized(value) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


def _check_binop(operator: str, left, right) -> None:
    if operator == "*":
        count = right if isinstance(right, int) else left if isinstance(left, int) else 0
        size = max(_sized(left), _sized(right))
        if size and count * size > MAX_RENDER:
            raise TemplateRefused(f"a repetition of {size:,} x {count:,} items, more than {MAX_RENDER:,}")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > MAX_POWER:
            raise TemplateRefused(f"{left} ** {right}: a number of more than {MAX_POWER} bits")
    elif operator == "%" and isinstance(left, str):
        import re

        widths = [int(w) for w in re.findall(r"%[-#0 +]*(\d+)", left)]
        if widths and max(widths) > MAX_RENDER:
            raise TemplateRefused(f"a format width of {max(widths):,}, more than {MAX_RENDER:,}")


def _bounded_filter(filter_fn, position: int):
    """A filter whose argument at `position` (after the value) is a width: refused above MAX_RENDER."""
    import functools

    @functools.wraps(filter_fn)
    def bounded(*args, **kwargs):
        widths = [a for a in args[1 : position + 1] if isinstance(a, int)] + [
            v for k, v in kwargs.items() if k == "width" and isinstance(v, int)
        ]
        if any(w > MAX_RENDER for w in widths):
            raise TemplateRefused(f"a width of {max(widths):,}, more than {MAX_RENDER:,}")
        return filter_fn(*args, **kwargs)

    return bounded


@functools.cache
def bounded_sandbox() -> type:
    """jinja2's ImmutableSandboxedEnvironment with the size checks above (see the comment there)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for name, position in (("center", 1), ("indent", 1), ("wordwrap", 1), ("format", 9)):
                if name in self.filters:
                    self.filters[name] = _bounded_filter(self.filters[name], position)

        def call_binop(self, context, operator, left, right):
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

    return BoundedSandbox


def bound_templates() -> None:
    """transformers' chat templates compiled in the bounded sandbox from now on (it names the sandbox class in
    its module, chat_template_utils, and caches compiled templates: the cache is cleared once)."""
    from transformers.utils import chat_template_utils as utils

    if getattr(utils, "ImmutableSandboxedEnvironment", None) is bounded_sandbox():
        return
    utils.ImmutableSandboxedEnvironment = bounded_sandbox()
    compile_cache = getattr(utils._compile_jinja_template, "cache_clear", None)
    if compile_cache is not None:
        compile_cache()


@contextlib.contextmanager
def rendering(seconds: float | None = None) -> Iterator[None]:
    """A chat template's render, bounded: the bounded sandbox, and a SIGALRM timer where there is one (the main
    thread of a platform with SIGALRM; elsewhere the render is bounded in size only). Raises TemplateRefused for a
    render that ran out of time, broke a size bound or the sandbox's rules (jinja2's SecurityError)."""
    from jinja2.exceptions import SecurityError

    seconds = seconds or RENDER_SECONDS
    bound_templates()
    timed = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()

    def expired(signum, frame):
        raise TemplateRefused(f"the chat template did not finish rendering in {seconds:g} s (a loop without end?)")

    previous = signal.signal(signal.SIGALRM, expired) if timed else None
    if timed:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except SecurityError as e:
        raise TemplateRefused(f"the chat template breaks the sandbox's rules ({e})") from None
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def render_prompt(tok, messages: list[dict], where: str) -> str:
    """`messages` through `tok`'s chat template with the generation prompt, bounded (`rendering`): what `chat` and
    `merge` send the model. A template that breaks a bound is a UsageError (exit 2) naming `where` it came from."""
    from fsdp_tune.errors import UsageError

    try:
        with rendering():
            return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except TemplateRefused as e:
        hint = "fix or replace the chat template (tokenizer_config.json's chat_template, or chat_template.jinja)"
        raise UsageError(f"{where}: {e}", hint) from None
