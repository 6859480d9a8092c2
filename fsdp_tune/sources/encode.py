"""One converted row (TRL's representation, sources/convert.py) -> training sequences: token ids and the mask
of the tokens in the loss. Messages (alpaca and ShareGPT arrive as messages) train their assistant turns,
prompt-completion its completion, text every token; `train_all` (--train_on_prompt) every token everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from fsdp_tune.config.templates import template_fault
from fsdp_tune.sources.clip import Reach, TooLarge, clip, row_chars
from fsdp_tune.sources.convert import tool_calls_as_text
from fsdp_tune.sources.masking import (
    Encoded,
    Renderer,
    RowRejected,
    encode_messages,
    prompt_completion_mask,
    truncate,
)


@dataclass
class Encoder:
    tokenizer: Any
    max_len: int | None  # None: TRL's packing keeps every token (bfd_split, wrapped)
    fallback: str = "split"  # --mask_fallback
    eos_token: str | None = None  # SFTConfig's eos_token, else the tokenizer's
    keep_end: bool = False  # --truncation_mode keep_end
    seq_len: int | None = None  # max_seq_len, which bounds the work per row even when max_len is None (clip.py)
    images: Any = None  # a vision-language run's ImageTokens (vision_rows.py): rows with images are measured by it
    text_only: bool = False  # rank 0 of a language model's run: a row with images is skipped (the launcher: False)

    @classmethod
    def for_run(cls, tokenizer, data: Any, images: Any = None) -> Encoder:
        """Cut at max_seq_len as TRL would, here, so the rows whose answer is cut away are counted, not dropped
        silently; TRL's packing strategies that keep every token (bfd_split, wrapped) get whole sequences.
        `data`: the rank spec's DataSpec (its packing and cutting settings)."""
        packs_whole = data.packing and data.packing_strategy != "bfd"
        return cls(
            tokenizer,
            None if packs_whole else data.max_seq_len,
            fallback=data.mask_fallback,
            eos_token=data.eos_token,
            keep_end=data.truncation_mode == "keep_end",
            seq_len=data.max_seq_len,
            images=images,
        )

    def encode(self, row: dict[str, Any], train_all: bool) -> list[Encoded]:
        """Sequences of one row, cut at max_len (rows whose answer is cut away are the caller's to skip); a row
        far longer than max_seq_len is cut before rendering, or refused (TooLarge) when it cannot be."""
        row, clipped = self.fit(row)
        out = self.sequences(row, train_all)
        for e in out:
            e.clipped = clipped
        return out

    @cached_property
    def reach(self) -> Reach | None:
        limit = self.max_len or self.seq_len
        return Reach.of(self.tokenizer, limit) if limit else None

    def fit(self, row: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """(the row as rendered, whether text past max_seq_len's reach was left out of it)."""
        reach = self.reach
        size = row_chars(row) if reach else 0
        if reach is None or size <= reach.chars:
            return row, False
        clipped = clip(row, reach.chars, self.keep_end) if self.max_len is not None else None
        if clipped is not None:
            return clipped, True
        if size > reach.bound:
            raise TooLarge(f"{size:,} characters, over the per-row bound of {reach.bound:,}")
        return row, False

    def sequences(self, row: dict[str, Any], train_all: bool, cut: bool = True) -> list[Encoded]:
        """The row's sequences, cut at max_len (`cut`; a row with images is cut where its image tokens are counted:
        vision_rows.py)."""
        if "messages" in row:
            messages = row["messages"]
            if any(m.get("tool_calls") for m in messages) and not self.renders_tool_calls:
                messages = tool_calls_as_text(messages)  # else the answer would be an empty turn
            out = encode_messages(
                self.tokenizer, messages, tools=row.get("tools"), train_all=train_all, fallback=self.fallback
            )
        elif "prompt" in row:
            out = [self.prompt_completion(row["prompt"], row["completion"], row.get("tools"), train_all)]
        else:
            out = [self.text(row["text"])]
        return [truncate(e, self.max_len, self.keep_end) for e in out] if cut else out

    @cached_property
    def renders_tool_calls(self) -> bool:
        """Whether the chat template writes an assistant's `tool_calls` (plain ChatML and zephyr do not)."""
        call = {"type": "function", "function": {"name": "fsdp_tune_probe", "arguments": {"x": 1}}}
        probe = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        try:
            return "fsdp_tune_probe" in Renderer(self.tokenizer).text(probe)
        except Exception:  # noqa: BLE001 - a template that refuses tool calls renders none
            return False

    @property
    def eos(self) -> str:
        return self.eos_token or self.tokenizer.eos_token or ""

    def prompt_completion(self, prompt, completion, tools, train_all: bool) -> Encoded:
        """TRL's own tokenization of a prompt-completion row, done here so it is done once: message lists are
        rendered with the generation prompt against the whole; strings tokenized, the EOS appended."""
        if isinstance(prompt, list):
            renderer = Renderer(self.tokenizer, tools)
            try:
                prompt_ids = renderer.ids(prompt, add_generation_prompt=True)
                full = renderer.ids(prompt + completion)
            except Exception as e:  # noqa: BLE001 - the template's own refusal
                fault = template_fault(e)  # the template's own fault (a bound, the sandbox): not this row's
                if fault is not None:
                    raise fault from None
                raise RowRejected(f"the chat template refuses this row: {type(e).__name__}: {e}") from e
        else:
            if self.eos and not completion.endswith(self.eos):
                completion += self.eos
            prompt_ids = list(self.tokenizer(text=prompt)["input_ids"])
            full = list(self.tokenizer(text=prompt + completion)["input_ids"])
        return Encoded(full, prompt_completion_mask(prompt_ids, full, train_all), ["prompt_completion"])

    def text(self, text: str) -> Encoded:
        """Plain text: every token, the EOS appended as TRL does (sft_trainer.py add_eos)."""
        if self.eos and not text.endswith(self.eos):
            text += self.eos
        ids = list(self.tokenizer(text=text)["input_ids"])
        return Encoded(ids, [1] * len(ids), ["text"])
