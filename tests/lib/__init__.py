"""One process with the libraries (torch, transformers, PEFT, TRL, datasets): no torchrun."""
