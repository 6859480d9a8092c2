"""The saving step: the adapter gathered whole (save.py), re-opened and checked (verify.py), pushed (hub.py)."""
