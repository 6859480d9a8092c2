"""What `train` checks on this machine and these files before any rank starts (PFnnn): the model's files, the data
rows (data.py, tokens.py), the disk, the GPUs' memory, the network and trackers, a resume's checkpoint. No torch."""
