"""The rules: one module per family (fsdp, parallelism, quant, lora, training, launch, model); registry.py
holds the registry, catalog.py runs them."""
