"""Chat templates for `--chat_template_format` (the ones PEFT's examples/sft uses), as plain data."""

from __future__ import annotations

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
