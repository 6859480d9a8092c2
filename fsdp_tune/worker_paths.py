"""File names shared by the launcher and the ranks."""

RESOLVED_NAME = "fsdp_tune_resolved.json"
SUMMARY_NAME = "fsdp_tune_summary.json"
COMPLETE_MARKER = "fsdp_tune_complete"
