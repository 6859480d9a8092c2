"""Models fsdp-tune builds itself (tiny.py: the builtin models), run in a subprocess of the launcher."""
