"""The model step: the model on the loading path the rank spec decided (build.py), sharded or from_pretrained."""
