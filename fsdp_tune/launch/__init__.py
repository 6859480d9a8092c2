"""`fsdp-tune train`'s steps after the decisions (train.py), the torchrun launch (torchrun.py), stop requests
(stopping.py) and the failure report (failure.py, causes.py)."""
