"""Regenerate tests/fixtures/schedulers/skypilot/*.json: SkyPilot's task, resources and storage schemas.

SkyPilot builds its JSON schemas in Python (sky/utils/schemas.py: get_task_schema, get_resources_schema,
get_storage_schema) and validates a task YAML with them (sky/task.py Task.from_yaml_config; resources and
file_mounts are checked against the other two), so the published schema is what those functions return for a
release. Run with that release installed in a throwaway venv (it is not a dependency of fsdp-tune):

    python3 -m venv /tmp/skyvenv && /tmp/skyvenv/bin/pip install skypilot==0.14.1
    /tmp/skyvenv/bin/python scripts/gen_skypilot_schemas.py

and update SOURCE.md beside the files.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

from sky.utils import schemas  # type: ignore[import-not-found]

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "schedulers" / "skypilot"

if __name__ == "__main__":
    for name, schema in {
        "task": schemas.get_task_schema(),
        "resources": schemas.get_resources_schema(),
        "storage": schemas.get_storage_schema(),
    }.items():
        (OUT / f"{name}.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(f"skypilot {version('skypilot')}: wrote {OUT}/{{task,resources,storage}}.json")
