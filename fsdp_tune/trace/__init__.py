"""`fsdp-tune plan --trace`: one training step executed at the run's real sizes and world size, on this machine.

The model is built from its config.json on the meta device exactly as the ranks build it (the rank spec from
decide/rank.py with a simulated GPU machine; worker/loading/sharded.py's and units.py's builders: LoRA,
QLoRA's packed weights, FSDP2 units, activation checkpointing, mixed precision, offload, the device mesh), its
tensors become FakeTensors (shapes, dtypes, no storage) on a `cpu` fake device, a fake process group stands in for
every other rank, and torch's FSDPMemTracker records live memory by category while one step runs: transformers'
forward, TRL's fused LM head, backward, gradient clipping, AdamW. A few decoder layers are traced (all layers are
identical) and every phase of the step is extrapolated linearly to the model's depth. Under context parallelism
the step runs inside torch's context_parallel with torch's ring attention on the fake process group (context.py).

Rank side: this package imports torch and the HF stack; `plan` imports it only when --trace is given.
"""
