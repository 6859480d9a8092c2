"""The data step: every source converted, checked and tokenized once, with answer masks (prepare.py)."""
