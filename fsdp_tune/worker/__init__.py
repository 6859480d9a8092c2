"""The per-rank side: the only code that imports torch, transformers, peft, trl and bitsandbytes.

Each rank reads OUTPUT_DIR/fsdp_tune_resolved.json (written once by the launcher) and never re-parses
the user's files.
"""
