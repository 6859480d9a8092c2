"""File names shared by the launcher and the ranks."""

RESOLVED_NAME = "fsdp_tune_resolved.json"
SUMMARY_NAME = "fsdp_tune_summary.json"
COMPLETE_MARKER = "fsdp_tune_complete"
STOP_FILE = "fsdp_tune_stop"  # written by the launcher on SIGINT/SIGTERM: finish the step, checkpoint, stop
