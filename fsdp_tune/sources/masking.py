"""Answer masks for any chat template, without {% generation %} markers.

The answer of assistant turn i is what the template adds between
    P_i = render(messages[:i], add_generation_prompt=True)   (the prompt the model sees at inference)
    E_i = render(messages[:i+1])                              (the conversation through turn i)
measured in tokens against the whole conversation F = render(messages). That is TRL's prompt-completion
rule (sft_trainer.py tokenize_fn: the prompt with the generation prompt against prompt + completion, their
common prefix), applied to every assistant turn.

It needs E_i to be a token prefix of F (the template does not re-render earlier turns once later ones
exist). P_i need only share a prefix with F (Qwen3 with enable_thinking=False, DeepSeek-R1 add to the
generation prompt what the rendered turn lacks: the answer starts where they diverge, as in TRL).
When E_i is not a prefix of F (Qwen3 and DeepSeek-R1 drop the reasoning of turns before the last user
turn), `fallback` chooses:
    "split"   turn i becomes its own sequence, render(messages[:i+1]) with only turn i trained: exactly
              what the model produced at inference; the main sequence keeps the consistent turns
    "locate"  one sequence: the turn is found in F by rendering F again with turn i replaced by a sentinel
              and diffing the tokens, extended through the end-of-turn token
    "error"   InconsistentTemplate

No torch: `tokenizer` is any transformers tokenizer with a chat template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fsdp_tune.config.templates import template_fault

SENTINEL = "\u27e6fsdp-tune-sentinel\u27e7"


class InconsistentTemplate(ValueError):
    """--mask_fallback error: the template renders the conversation through a turn differently."""


class RowRejected(ValueError):
    """The chat template refuses the row (Gemma's 'roles must alternate' on a tool turn, ...)."""


@dataclass
class Encoded:
    """One training sequence: mask[t] == 1 puts token t in the loss."""

    input_ids: list[int]
    mask: list[int]
    methods: list[str] = field(default_factory=list)  # per answer: prefix | split | locate | lost | all | ...
    truncated: bool = False
    problems: list[str] = field(default_factory=list)
    clipped: bool = False  # text past max_seq_len's reach was left out before rendering (clip.py)
    # a vision-language run's sequence: the images its placeholders stand for, and each one's tokens once expanded
    # (sources/vision_rows.py)
    images: list = field(default_factory=list)
    image_tokens: list[int] = field(default_factory=list)


def _ids(out) -> list[int]:
    """apply_chat_template(tokenize=True) gives a BatchEncoding or a list, depending on the version."""
    if isinstance(out, Mapping) or hasattr(out, "keys"):
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return list(out)


class Renderer:
    """apply_chat_template with the row's tools and template arguments; token ids out."""

    def __init__(self, tokenizer, tools=None, template_kwargs: Mapping | None = None):
        self.tok = tokenizer
        self.kwargs = dict(template_kwargs or {})
        if tools:
            self.kwargs["tools"] = tools

    def text(self, messages, add_generation_prompt: bool = False) -> str:
        return self.tok.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs
        )

    def ids(self, messages, add_generation_prompt: bool = False) -> list[int]:
        out = self.tok.apply_chat_template(
            list(messages), tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt, **self.kwargs
        )
        return _ids(out)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def is_prefix(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) <= len(b) and list(b[: len(a)]) == list(a)


def stop_ids(tokenizer) -> set[int]:
    """Tokens that end a turn: special and added tokens (<|im_end|>, <|eot_id|>, </s>, <end_of_turn>)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    try:
        ids |= set(tokenizer.get_added_vocab().values())
    except (AttributeError, NotImplementedError):
        pass
    return ids


class _Turns:
    """The per-row state: the full rendering, its mask, and the answer spans found so far."""

    def __init__(self, tokenizer, messages, renderer: Renderer):
        self.tok, self.messages, self.r = tokenizer, messages, renderer
        try:
            self.full = renderer.ids(messages)
        except Exception as e:  # noqa: BLE001 - jinja's TemplateError, raise_exception(...) inside templates
            fault = template_fault(e)  # the template's own fault (a bound, the sandbox): not this row's
            if fault is not None:
                raise fault from None
            raise RowRejected(f"the chat template refuses this conversation: {type(e).__name__}: {e}") from e
        self.mask = [0] * len(self.full)
        self.methods: list[str] = []
        self.extra: list[Encoded] = []
        self.problems: list[str] = []
        self.stops = stop_ids(tokenizer)

    def trim(self, ids: Sequence[int], start: int, end: int) -> int:
        """Whitespace after the span's last stop token ('\\n' after <|im_end|>) is a separator the model never
        generates (it stops at the stop token): left out, as TRL's training templates do."""
        for t in range(end - 1, start - 1, -1):
            if ids[t] in self.stops:
                return t + 1
            if self.tok.decode([ids[t]]).strip():
                return end
        return end

    def has_text(self, ids: Sequence[int]) -> bool:
        return any(t not in self.stops and self.tok.decode([t]).strip() for t in ids)

    def answer(self, i: int, fallback: str) -> None:
        if i == 0:  # nothing before it: no prompt to measure it against (templates refuse an empty conversation)
            self.located(i)
            return
        p = self.r.ids(self.messages[:i], add_generation_prompt=True)
        e = self.full if i == len(self.messages) - 1 else self.r.ids(self.messages[: i + 1])
        start = common_prefix_length(p, self.full)
        if start < len(p):
            self.problems.append(
                f"turn {i}: the generation prompt is not a token prefix; the answer starts where they differ"
            )
        if is_prefix(e, self.full):
            end = self.trim(self.full, start, len(e))
            self.mask[start:end] = [1] * (end - start)
            self.methods.append("prefix")
            if not self.has_text(self.full[start:end]):
                self.problems.append(f"turn {i}: the rendered answer is empty (the template drops its content?)")
            return
        why = f"turn {i}: the template renders the conversation through this turn differently from the whole"
        if fallback == "error":
            raise InconsistentTemplate(why)
        self.problems.append(why)
        if fallback == "split":
            s = common_prefix_length(p, e)
            end = self.trim(e, s, len(e))
            self.extra.append(Encoded(list(e), [0] * s + [1] * (end - s) + [0] * (len(e) - end), ["split"]))
            self.methods.append("split")
            return
        self.located(i)

    def located(self, i: int) -> None:
        """Turn i trained where the sentinel diff finds it ("locate"), or reported as not trained ("lost")."""
        span = self.locate(i)
        if span is None:
            self.problems.append(f"turn {i}: not found in the rendered conversation; not trained")
            self.methods.append("lost")
            return
        self.mask[span[0] : span[1]] = [1] * (span[1] - span[0])
        self.methods.append("locate")

    def locate(self, i: int, window: int = 4) -> tuple[int, int] | None:
        """Turn i's span in F: diff against F rendered with turn i replaced by a sentinel of the same role,
        then through the next stop token within `window` tokens."""
        probe = [dict(m) for m in self.messages]
        probe[i] = {"role": self.messages[i]["role"], "content": SENTINEL}
        other, full = self.r.ids(probe), self.full
        start = common_prefix_length(full, other)
        back = 0
        while back < min(len(full), len(other)) - start and full[-1 - back] == other[-1 - back]:
            back += 1
        end = len(full) - back
        if end <= start:
            return None
        stop = next((t + 1 for t in range(end, min(end + window, len(full))) if full[t] in self.stops), end)
        return start, stop


def encode_messages(
    tokenizer, messages: list[dict], *, tools=None, template_kwargs=None, train_all: bool = False, fallback="split"
) -> list[Encoded]:
    """Token ids and answer mask of one conversation: a list, since 'split' may add sequences."""
    turns = _Turns(tokenizer, messages, Renderer(tokenizer, tools, template_kwargs))
    turns.problems += dropped_content(turns.r.text(messages), messages)
    if train_all:
        return [Encoded(turns.full, [1] * len(turns.full), ["all"], problems=turns.problems)]
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            turns.answer(i, fallback)
    main = Encoded(turns.full, turns.mask, turns.methods, problems=turns.problems)
    if any(turns.mask) or not turns.extra:
        return [main, *turns.extra]
    turns.extra[0].problems = turns.problems + turns.extra[0].problems  # every answer went to its own sequence
    return turns.extra


def dropped_content(text: str, messages) -> list[str]:
    """Turns whose text is missing from the rendering: the template drops that role (zephyr drops `tool`) or
    rewrites it. Reasoning before </think> is left out of the check (Qwen3 / DeepSeek-R1 strip it)."""
    out = []
    for j, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, str):
            content = content.split("</think>")[-1].strip()
            if content and content not in text:
                out.append(f"turn {j} ({m.get('role')}): its content is not in the rendered text (template drops it)")
    return out


def truncate(enc: Encoded, max_len: int | None, keep_end: bool = False) -> Encoded:
    """Cut at max_len as TRL would (keep_start; keep_end when --truncation_mode keep_end)."""
    if max_len is None or len(enc.input_ids) <= max_len:
        return enc
    cut = slice(-max_len, None) if keep_end else slice(None, max_len)
    return Encoded(enc.input_ids[cut], enc.mask[cut], enc.methods, True, enc.problems)


def prompt_completion_mask(prompt_ids: Sequence[int], full_ids: Sequence[int], train_all: bool) -> list[int]:
    """TRL's rule for prompt-completion rows: the completion starts after the common prefix."""
    if train_all:
        return [1] * len(full_ids)
    start = common_prefix_length(prompt_ids, full_ids)
    return [0] * start + [1] * (len(full_ids) - start)
