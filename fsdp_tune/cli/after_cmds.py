"""Commands for after a run: chat, merge, report, env."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from fsdp_tune.cli.common import DebugOpt, guard, style

TRUST_HELP = "Run the model folder's own Python code (auto_map); default: only if the run trained with it."


def merge_cmd(
    adapter: str = typer.Option(..., "--adapter", help="The adapter folder (a run's output dir)."),
    output: str = typer.Option(..., "-o", "--output", help="Folder for the merged model."),
    base: Optional[str] = typer.Option(None, "--base", help="Base model (default: the adapter's record)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 (default: the base's own)"),
    into: Optional[str] = typer.Option(
        None, "--into", help="QLoRA: dequantized (the 4-bit weights it trained against; default) | base (16-bit)"
    ),
    max_shard_size: str = typer.Option("5GB", "--max_shard_size", "--max-shard-size"),
    device: str = typer.Option("cpu", "--device", help="cpu, or one GPU such as cuda:0"),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty output folder."),
    trust_remote_code: bool = typer.Option(False, "--trust_remote_code", help=TRUST_HELP),
    debug: bool = DebugOpt,
) -> None:
    """Merge a LoRA/DoRA adapter into its base model, outside FSDP, and check the logits match."""

    def run() -> None:
        from fsdp_tune.tools.merge import merge
        from fsdp_tune.tools.quiet import libraries_quiet

        with libraries_quiet():
            r = merge(adapter, base, output, dtype, max_shard_size, device, force, into, trust_remote_code)
        if r["into"] == "dequantized":
            typer.echo(
                f"note: QLoRA adapter: merged into the base's 4-bit weights as the run quantized them, dequantized "
                f"to {r['dtype']} (what it was trained against); --into base merges into the 16-bit base instead"
            )
        elif r["quantized_adapter"]:
            typer.echo(
                f"note: QLoRA adapter: merged into the 16-bit base loaded unquantized in {r['dtype']} (the weights "
                "before quantization; the adapter was trained against their 4-bit rounding: --into dequantized)"
            )
        typer.echo(
            style("ok:", fg="green", bold=True) + f" merged {r['base']} + {adapter} -> {r['output']} in {r['dtype']} "
            f"({r['dtype_source']}); logits match {'4-bit base' if r['into'] == 'dequantized' else 'base'}+adapter "
            f"(max relative difference {r['max_rel_logit_diff']:.1e}, tolerance {r['tolerance']:.0e})"
        )

    guard(run, debug)


def export_cmd(
    checkpoint: str = typer.Argument(..., metavar="CHECKPOINT", help="A sharded checkpoint: RUN/checkpoint-N."),
    output: str = typer.Option(..., "-o", "--output", help="Folder for the adapter (chat and merge take it)."),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty output folder."),
    debug: bool = DebugOpt,
) -> None:
    """Export a sharded checkpoint's adapter as a PEFT adapter folder, to chat with, merge or compare."""

    def run() -> None:
        from fsdp_tune.tools.export import export

        r = export(checkpoint, output, force)
        step = f"step {r['step']}'s " if r["step"] is not None else ""
        typer.echo(
            style("ok:", fg="green", bold=True) + f" exported {step}adapter ({r['tensors']} tensors) from "
            f"{checkpoint} -> {r['output']}; try it: fsdp-tune chat {r['output']}"
        )

    guard(run, debug)


def chat_cmd(
    run_dir: str = typer.Argument(
        ..., metavar="RUN", help="A finished run's output dir, an exported adapter, or a whole model's folder."
    ),
    prompt: list[str] = typer.Option([], "--prompt", help="Answer this and exit (repeatable)."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="A file of prompts, one per line."),
    system: Optional[str] = typer.Option(None, "--system", help="A system message before each conversation."),
    max_new_tokens: int = typer.Option(256, "--max_new_tokens", "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy (the default); above 0: sampling."),
    base: Optional[str] = typer.Option(None, "--base", help="Base model (default: the one the run loaded)."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda:N (default: cuda:0 if present)."),
    image: Optional[str] = typer.Option(
        None, "--image", help="An image for a vision-language run: shown with each prompt (the first turn)."
    ),
    trust_remote_code: bool = typer.Option(False, "--trust_remote_code", help=TRUST_HELP),
    debug: bool = DebugOpt,
) -> None:
    """Talk to what a run trained: its base (4-bit again for QLoRA), its adapter and chat template; or to a whole
    model (what merge writes, any Transformers model folder) in its own dtype with its own chat template.

    Without --prompt/--prompts: type a message, read the streamed answer; an empty line or Ctrl-D ends.
    """

    def run() -> None:
        from fsdp_tune.tools.chat import answer, image_for, load, prompts_from

        asked = prompts_from(prompt, prompts)
        chat = load(run_dir, base, device, trust_remote_code)
        picture = image_for(chat, image)
        typer.echo(f"chat: {chat.described}", err=True)
        opening = [{"role": "system", "content": system}] if system else []
        for i, text in enumerate(asked):
            if len(asked) > 1:
                typer.echo(f"{'' if i == 0 else chr(10)}> {text}")
            turn = [*opening, {"role": "user", "content": text}]
            _said(answer(chat, turn, max_new_tokens, temperature, image=picture))
        if asked:
            return
        typer.echo("type a message; an empty line or Ctrl-D ends", err=True)
        history = list(opening)
        while True:
            try:
                text = input("> ").strip()
            except EOFError:
                text = ""
            if not text:
                return
            history.append({"role": "user", "content": text})
            reply = answer(chat, history, max_new_tokens, temperature, image=picture)  # the image: the first turn's
            history.append({"role": "assistant", "content": _said(reply)})

    guard(run, debug)


def _said(reply: str) -> str:
    if not reply.strip():
        typer.echo("(no reply: the model ended its turn at once)", err=True)
    return reply


def report_cmd(
    runs: list[str] = typer.Argument(..., help="One or more run output dirs."),
    output: Optional[str] = typer.Option(
        None, "-o", "--output", help="Plot file (default: RUN/loss.png; ./loss.png for several runs)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing -o file (RUN/loss.png is always redrawn)."),
    debug: bool = DebugOpt,
) -> None:
    """Print a run's summary again and redraw loss.png; several runs share one figure."""

    def run() -> None:
        from fsdp_tune.errors import UsageError
        from fsdp_tune.output.files import write_out
        from fsdp_tune.output.tables import format_rows
        from fsdp_tune.runfiles import LOSS_PLOT_NAME, METRICS_NAME
        from fsdp_tune.tools.report import drawn, plot, summary_rows

        missing = [r for r in runs if not os.path.lexists(Path(r) / METRICS_NAME)]
        if missing:
            raise UsageError(f"no {METRICS_NAME} in {', '.join(missing)}", "pass the output dir of a run")
        typer.echo(format_rows(summary_rows(runs)))
        if output is None and len(runs) == 1:  # the run's own loss.png: replaced whole, never through a link
            out = plot(runs, Path(runs[0]) / LOSS_PLOT_NAME)
        else:  # a file outside the run folders: the writer door (--force for an existing one)
            target = output or LOSS_PLOT_NAME
            out = write_out(target, drawn(runs, target), force)
        typer.echo(f"plot: {out}")

    guard(run, debug)


def env_cmd(as_json: bool = typer.Option(False, "--json"), debug: bool = DebugOpt) -> None:
    """Print what a bug report needs: versions, CUDA/NCCL, GPUs, bitsandbytes, flash-attn, CPUs, RAM."""

    def run() -> None:
        from fsdp_tune.output.tables import format_info
        from fsdp_tune.tools.envinfo import collect

        info = collect()
        typer.echo(json.dumps(info, indent=2) if as_json else format_info(info))

    guard(run, debug)
