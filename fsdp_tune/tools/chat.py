"""`fsdp-tune chat RUN`: try what a run trained, in one command.

The base model is loaded as the run loaded it (its dtype; 4-bit again, with the run's BitsAndBytesConfig, for
a QLoRA run: the weights the adapter was trained against), the run's adapter goes on top, and prompts go
through the tokenizer the run saved, which carries its chat template. One process, on the CPU or one GPU;
answers stream as they are generated (transformers' TextStreamer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fsdp_tune.decide.spec import RankSpec, read_from
from fsdp_tune.errors import UsageError
from fsdp_tune.tools.base import check_adapter_folder, is_reward_adapter, recorded_base, resize_as_trained
from fsdp_tune.tools.quiet import libraries_quiet, quiet_transformers


@dataclass
class Chat:
    model: object
    tokenizer: object
    device: str
    described: str  # what was loaded, for people
    processor: object | None = None  # a vision-language model's (tools/vision.py): prompts may carry an image


def base_of(run_dir: Path, spec: RankSpec | None, base: str | None) -> str:
    """--base, else the model the run loaded (a builtin model rebuilt when this machine lacks its folder),
    else what the adapter records."""
    if base:
        return base
    if spec is not None:
        name = spec.model.name_or_path
        if not Path(name).exists() and spec.model.requested.startswith("builtin:"):
            from fsdp_tune.sources.builtin import materialize

            return str(materialize(spec.model.requested.removeprefix("builtin:")))
        return name
    return recorded_base(run_dir)


def load(run: str, base: str | None = None, device: str | None = None) -> Chat:
    """The run's model, ready to answer; what the libraries say while loading it is not shown (the answers are
    the output: no loading bars, deprecation notes or bitsandbytes' backend notes)."""
    run_dir = Path(run)
    check_adapter_folder(run_dir, "a finished run's folder")
    if is_reward_adapter(run_dir):
        raise UsageError(
            f"{run} is a reward model (a sequence classifier that scores text with one number): it does not generate",
            f"fsdp-tune merge --adapter {run} -o {run_dir.name}-merged gives an AutoModelForSequenceClassification "
            "to score with",
        )
    with libraries_quiet():
        return _load(run_dir, base, device)


def _load(run_dir: Path, base: str | None, device: str | None) -> Chat:
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer

    from fsdp_tune.tools.base import model_class
    from fsdp_tune.tools.vision import processor_of, reads_images

    quiet_transformers()
    spec = read_from(run_dir)
    base_path = base_of(run_dir, spec, base)
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
            how = f"4-bit {spec.model.quantization['bnb_4bit_quant_type']}, as trained"
    processor = processor_of(run_dir, base_path) if reads_images(base_path) else None
    tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(str(run_dir))
    auto, _ = model_class(run_dir, base_path)
    model = auto.from_pretrained(base_path, **kwargs)
    if "device_map" not in kwargs:
        model = model.to(device)
    resize_as_trained(model, tokenizer)
    model = PeftModel.from_pretrained(model, str(run_dir)).eval()
    template = "its chat template" if getattr(tokenizer, "chat_template", None) else "no chat template (plain text)"
    reads = ", reads images (--image FILE)" if processor is not None else ""
    described = f"{base_path} ({how}) + adapter {run_dir}, {template}{reads}, on {device}"
    return Chat(model, tokenizer, device, described, processor)


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
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
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
