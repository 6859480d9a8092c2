"""Rows of any format -> TRL's representation (pure Python: the launcher checks rows with it, rank 0 converts
every row with it).

messages / alpaca / sharegpt -> {"messages": [...], "tools"?}; prompt_completion -> {"prompt", "completion",
"tools"?} (strings or message lists, as TRL defines them); text -> {"text"}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_tune.sources import vision
from fsdp_tune.sources.formats import ALPACA, CONTENT_KEYS, MESSAGES, PROMPT_COMPLETION, SHAREGPT, TEXT, Format
from fsdp_tune.sources.formats import decode_json as _json

STANDARD_ROLES = ("system", "user", "assistant", "tool")
# ShareGPT speaker names seen in the wild -> TRL roles (axolotl's and LLaMA-Factory's tables together).
# "function_call" is an assistant turn whose value is a JSON {name, arguments} call; "observation" is the
# tool's answer. --dataset_roles speaker=role adds to it.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "prompter": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
    "function_response": "tool",
    "ipython": "tool",
}


def text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def clean_message(message: Mapping) -> dict:
    """None-valued keys dropped: Arrow unifies struct fields across rows, so a turn without tool calls comes
    back with `tool_calls: None`, which templates testing `message.tool_calls is defined` mis-render."""
    out = {k: v for k, v in message.items() if v is not None}
    if "content" not in out and out.get("role") == "assistant" and out.get("tool_calls"):
        out["content"] = ""
    return out


def to_trl(row: Mapping, fmt: Format, roles: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One row in TRL's representation."""
    c = fmt.columns
    if fmt.kind == TEXT:
        return {"text": text(row.get(c["text"]))}
    if fmt.kind == PROMPT_COMPLETION:
        prompt, completion = _json(row.get(c["prompt"])), _json(row.get(c["completion"]))
        if fmt.conversational:
            prompt = [clean_message(m) for m in prompt or []]
            completion = [clean_message(m) for m in completion or []]
        out: dict[str, Any] = {"prompt": prompt, "completion": completion}
    elif fmt.kind == MESSAGES:
        out = {"messages": [clean_message(m) for m in _json(row.get(c["messages"])) or []]}
    elif fmt.kind == ALPACA:
        out = {"messages": alpaca(row, fmt)}
    elif fmt.kind == SHAREGPT:
        out = {"messages": sharegpt(row, fmt, roles)}
    else:
        raise ValueError(f"unknown format {fmt.kind!r}")
    tools = _json(row.get(c["tools"])) if "tools" in c else None
    if tools:
        out["tools"] = tools
    if "messages" in out:
        out = with_images(out, row, fmt)
    return out


def with_images(out: dict[str, Any], row: Mapping, fmt: Format) -> dict[str, Any]:
    """A chat row's images (sources/vision.py): every image an {"type": "image"} block of its messages, the images
    in `images`, in order. A row of a dataset with an images column gets `images` even when it has none (a
    text-only row of vision data); a dataset without one, only when its messages hold image blocks."""
    column = fmt.columns.get("images")
    messages, inline = vision.with_blocks(out["messages"], placeholders=column is not None)
    images = (vision.refs(row.get(column)) if column else []) + inline
    if column is None and not vision.image_blocks(messages):
        return out
    return {**out, "messages": messages, "images": images}


def alpaca(row: Mapping, fmt: Format) -> list[dict]:
    """LLaMA-Factory's rule (data/converter.py): the system column, the history pairs as earlier turns, then
    user = instruction + "\\n" + input (empty parts left out), assistant = output."""
    c = fmt.columns
    messages: list[dict] = []
    system = text(row.get(c["system"])) if "system" in c else ""
    if system:
        messages.append({"role": "system", "content": system})
    for pair in (_json(row.get(c["history"])) if "history" in c else None) or []:
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            messages += [{"role": "user", "content": text(pair[0])}, {"role": "assistant", "content": text(pair[1])}]
        else:
            messages.append({"role": "user", "content": text(pair)})  # rowcheck reports it (bad-history)
    parts = [text(row.get(c["instruction"])), text(row.get(c["input"])) if "input" in c else ""]
    messages.append({"role": "user", "content": "\n".join(p for p in parts if p)})
    messages.append({"role": "assistant", "content": text(row.get(c["output"]))})
    return messages


def sharegpt(row: Mapping, fmt: Format, roles: Mapping[str, str] | None = None) -> list[dict]:
    """Speakers mapped to roles; a first `system` turn or the system column becomes the system message."""
    role_map = {**SHAREGPT_ROLES, **{k.lower(): v for k, v in (roles or {}).items()}}
    messages: list[dict] = []
    for turn in _json(row.get(fmt.columns["conversations"])) or []:
        if not isinstance(turn, Mapping):
            messages.append({"role": None, "content": text(turn)})  # rowcheck reports it (bad-turn)
            continue
        speaker = turn.get(fmt.role_key)
        value = turn.get(fmt.content_key)
        if value is None:  # keys mixed within one conversation
            value = next((turn[k] for k in CONTENT_KEYS if turn.get(k) is not None), None)
        if str(speaker).lower() == "function_call" and "function_call" not in (roles or {}):
            messages.append(function_call(value))
            continue
        message = {"role": role_map.get(str(speaker).lower(), speaker), "content": text(value)}
        for extra in ("tool_calls", "name", "tool_call_id", "reasoning_content"):
            if turn.get(extra) is not None:
                message[extra] = turn[extra]
        messages.append(message)
    column = fmt.columns.get("system")
    system = text(row.get(column)) if column else ""
    if system and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages


def function_call(value: Any) -> dict:
    """A ShareGPT function_call turn -> an assistant turn with `tool_calls` (kept as text when not JSON)."""
    call = _json(value)
    calls = call if isinstance(call, list) else [call]
    if not calls or not all(isinstance(c, dict) and "name" in c for c in calls):
        return {"role": "assistant", "content": text(value)}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}} for c in calls
        ],
    }


def tool_calls_as_text(messages: list[dict]) -> list[dict]:
    """For templates that drop `tool_calls`: the call as JSON text content, so the answer is not empty."""
    import json

    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [c.get("function", c) for c in m["tool_calls"]]
            call = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
            content = text(m.get("content")).strip()
            m = {"role": "assistant", "content": (content + "\n" if content else "") + call}
        out.append(m)
    return out
