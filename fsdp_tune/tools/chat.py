"""`fsdp-tune chat RUN`: try what a run trained, in one command.

The base model is loaded as the run loaded it (its dtype; 4-bit again, with the run's BitsAndBytesConfig, for
a QLoRA run: the weights the adapter was trained against), the run's adapter goes on top, and prompts go
through the tokenizer the run saved, which carries its chat template. One process, on the CPU or one GPU;
answers stream as they are generated (transformers' TextStreamer).

`fsdp-tune chat FOLDER` takes a whole model as well: what `merge` writes, or any Transformers model folder (a
local folder, or a Hub id's snapshot in the Hugging Face cache) with a config.json and no adapter_config.json. It
is loaded in its own dtype with its own tokenizer and chat template, through the same loader door, and answers
the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fsdp_tune.config.templates import render_prompt
from fsdp_tune.decide.spec import RankSpec, read_from
from fsdp_tune.errors import UsageError
from fsdp_tune.tools.base import check_adapter_folder, is_reward_adapter, locate, recorded_base, resize_as_trained
from fsdp_tune.tools.quiet import libraries_quiet, quiet_transformers


@dataclass
class Chat:
    model: object
    tokenizer: object
    device: str
    described: str  # what was loaded, for people
    processor: object | None = None  # a vision-language model's (tools/vision.py): prompts may carry an image
    template_from: str = ""  # the folder whose chat template renders the prompts, for messages


def base_of(run_dir: Path, spec: RankSpec | None, base: str | None) -> tuple[str, str]:
    """(the base as named, for people; its folder): --base, else the model the run loaded (a builtin model rebuilt
    when this machine lacks its folder), else what the adapter records; found on this machine or refused at once
    (tools/base.py locate)."""
    if base:
        return base, locate(base, run_dir, given=True)
    if spec is not None:
        name = spec.model.name_or_path
        if not Path(name).exists() and spec.model.requested.startswith("builtin:"):
            from fsdp_tune.sources.builtin import materialize

            return spec.model.requested, str(materialize(spec.model.requested.removeprefix("builtin:")))
        return spec.model.requested or name, locate(name, run_dir)
    recorded = recorded_base(run_dir)
    return recorded, locate(recorded, run_dir)


def trusted(spec: RankSpec | None, trust_remote_code: bool) -> bool:
    """The one setting: --trust_remote_code here, or the run's own `model.trust_remote_code` (it trained with it)."""
    return trust_remote_code or (spec is not None and spec.model.trust_remote_code)


def load(run: str, base: str | None = None, device: str | None = None, trust_remote_code: bool = False) -> Chat:
    """The run's model, ready to answer; what the libraries say while loading it is not shown (the answers are
    the output: no loading bars, deprecation notes or bitsandbytes' backend notes). Every folder is opened through
    the loader door (worker/loading/door.py)."""
    from fsdp_tune.config.folders import check_adapter

    run_dir = Path(run)
    whole = model_folder(run)
    if whole is not None:
        return load_model(whole, run, base, device, trust_remote_code)
    check_adapter_folder(run_dir, "a finished run's folder, an adapter or a model folder (it has no config.json)")
    check_adapter(run_dir)
    if is_reward_adapter(run_dir):
        raise UsageError(
            f"{run} is a reward model (a sequence classifier that scores text with one number): it does not generate",
            f"fsdp-tune merge --adapter {run} -o {run_dir.name}-merged gives an AutoModelForSequenceClassification "
            "to score with",
        )
    spec = read_from(run_dir)
    shown, base_path = base_of(run_dir, spec, base)
    trust = trusted(spec, trust_remote_code)
    from fsdp_tune.worker.loading.door import prepared

    with libraries_quiet():
        prepared(base_path, trust)  # before torch: a folder refused answers at once
        prepared(str(run_dir), trust, "the run's tokenizer")
        chat = _load(run_dir, spec, base_path, device, trust)
    chat.described = f"{shown}{'' if shown == base_path else f' [{base_path}]'} {chat.described}"
    return chat


def model_folder(name: str) -> Path | None:
    """The folder of a whole model `name` names (a config.json and no adapter_config.json: `merge`'s output, a full
    fine-tune's run, a model folder or a Hub id's snapshot in the cache), found by the model door
    (sources/model.py); None for anything else (a run's adapter)."""
    from fsdp_tune.runfiles import ADAPTER_CONFIG
    from fsdp_tune.sources.model import model_facts

    path = Path(name)
    if (path / ADAPTER_CONFIG).exists() or (path.exists() and not path.is_dir()):
        return None
    facts = model_facts(name)
    if facts.where not in ("local", "cache") or not facts.path or not Path(facts.path).is_dir():
        return None
    if not (facts.found or facts.problem):  # no config.json (an unreadable one: the loader door names it)
        return None
    folder = Path(facts.path)
    return None if (folder / ADAPTER_CONFIG).exists() else folder


def load_model(folder: Path, name: str, base: str | None, device: str | None, trust_remote_code: bool) -> Chat:
    """A whole model folder, ready to answer: its own dtype, tokenizer and chat template (a vision-language
    model's processor), through the loader door; a sequence classifier (a merged reward model) refused."""
    from fsdp_tune.config.model_kinds import KINDS
    from fsdp_tune.sources.model import fetch_config
    from fsdp_tune.tools.vision import kind_of_base, processor_of
    from fsdp_tune.worker.loading.door import open_model, open_tokenizer, prepared

    if base is not None:
        raise UsageError(
            f"--base {base}: {name} is a whole model (config.json, no adapter_config.json), not an adapter",
            f"fsdp-tune chat {name} (without --base)",
        )
    spec = read_from(folder)  # a full fine-tune's run folder: it trained with trust_remote_code or not
    trust = trusted(spec, trust_remote_code)
    with libraries_quiet():
        prepared(str(folder), trust, "the model")
        architectures = (fetch_config(str(folder)) or {}).get("architectures") or []
        if any(str(a).endswith("ForSequenceClassification") for a in architectures):
            raise UsageError(
                f"{name} is a sequence classifier ({architectures[0]}: a reward model scores text with one "
                "number): it does not generate",
                "chat with a causal language model's folder (a merged SFT run, a base model)",
            )
        import torch
        import transformers

        quiet_transformers()
        kind = kind_of_base(str(folder))
        device = device or ("cuda:0" if torch.cuda.is_available() else "cpu")
        processor = processor_of(folder, str(folder), trust) if KINDS[kind].processor else None
        tokenizer = processor.tokenizer if processor is not None else open_tokenizer(str(folder), trust)
        auto = getattr(transformers, KINDS[kind].auto_class)
        model = open_model(auto, str(folder), trust, dtype="auto").to(device).eval()
    template = "its chat template" if getattr(tokenizer, "chat_template", None) else "no chat template (plain text)"
    reads = ", reads images (--image FILE)" if processor is not None else ""
    shown = name if Path(name) == folder else f"{name} [{folder}]"
    dtype = str(model.dtype).removeprefix("torch.")
    described = f"{shown} (a whole model, its own dtype {dtype}), {template}{reads}, on {device}"
    return Chat(model, tokenizer, device, described, processor, str(folder))


def _load(run_dir: Path, spec: RankSpec | None, base_path: str, device: str | None, trust: bool) -> Chat:
    import torch

    from fsdp_tune.tools.base import model_class
    from fsdp_tune.tools.vision import processor_of, reads_images
    from fsdp_tune.worker.loading.door import open_adapter, open_model, open_tokenizer

    quiet_transformers()
    device = device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    kwargs: dict = {"dtype": "auto"}
    how = "its own dtype"
    if spec is not None:
        kwargs["dtype"] = getattr(torch, spec.model.dtype)
        how = spec.model.dtype
        if spec.model.attn_implementation != "flash_attention_2" or device.startswith("cuda"):
            kwargs["attn_implementation"] = spec.model.attn_implementation
        if spec.model.quantization:
            from fsdp_tune.worker.loading.pretrained import quantization_config

            kwargs.update(quantization_config=quantization_config(spec), device_map={"": device})
            how = f"4-bit {spec.model.quantization.bnb_4bit_quant_type}, as trained"
    processor = processor_of(run_dir, base_path, trust) if reads_images(base_path) else None
    tokenizer = processor.tokenizer if processor is not None else open_tokenizer(str(run_dir), trust)
    auto, _ = model_class(run_dir, base_path)
    model = open_model(auto, base_path, trust, **kwargs)
    if "device_map" not in kwargs:
        model = model.to(device)
    resize_as_trained(model, tokenizer)
    model = open_adapter(model, run_dir).eval()
    template = "its chat template" if getattr(tokenizer, "chat_template", None) else "no chat template (plain text)"
    reads = ", reads images (--image FILE)" if processor is not None else ""
    described = f"({how}) + adapter {run_dir}, {template}{reads}, on {device}"
    return Chat(model, tokenizer, device, described, processor, str(run_dir))


def answer(
    chat: Chat, messages: list[dict], max_new_tokens: int, temperature: float, stream: bool = True, image=None
) -> str:
    """Generate a reply to `messages` (streamed to stdout as it comes) and return it; `image` (a PIL image, for a
    vision-language model) goes before the text of the first user turn."""
    import torch
    from transformers import TextStreamer

    tok = chat.tokenizer
    if image is not None:
        messages = with_image(messages)
    if getattr(tok, "chat_template", None):
        text = render_prompt(tok, messages, f"{chat.template_from}'s chat template")
    else:
        text = "\n".join(m["content"] for m in messages)
    if image is not None:
        inputs = chat.processor(images=[image], text=[text], return_tensors="pt", add_special_tokens=False)
        inputs = inputs.to(chat.device)
    else:
        inputs = tok(text, return_tensors="pt", add_special_tokens=False).to(chat.device)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    with torch.no_grad():
        out = chat.model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            streamer=TextStreamer(tok, skip_prompt=True, skip_special_tokens=True) if stream else None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            **sampling,
        )
    return tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def with_image(messages: list[dict]) -> list[dict]:
    """The first user turn with an image block before its text (the processor's template places the image)."""
    out, placed = [], False
    for m in messages:
        if not placed and m["role"] == "user" and isinstance(m["content"], str):
            m = {**m, "content": [{"type": "image"}, {"type": "text", "text": m["content"]}]}
            placed = True
        out.append(m)
    return out


def image_for(chat: Chat, path: str | None):
    """--image FILE opened for a vision-language run (None without it); a UsageError for a language model's."""
    if path is None:
        return None
    from fsdp_tune.tools.vision import open_image

    if chat.processor is None:
        raise UsageError(
            f"--image {path}: this run's model reads no images (a language model)",
            "drop --image, or chat with a vision-language run",
        )
    return open_image(path)


def prompts_from(prompt: list[str], prompts_file: str | None) -> list[str]:
    """--prompt TEXT (repeatable), then --prompts FILE: one prompt per line, blank lines skipped."""
    found = list(prompt)
    if prompts_file:
        try:
            text = Path(prompts_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"--prompts {prompts_file}: cannot be read ({err})", "one prompt a line, UTF-8") from None
        found += [line.strip() for line in text.splitlines() if line.strip()]
    return found
