"""Emitted job files checked against what each scheduler publishes (tests/fixtures/schedulers/SOURCE.md).

Each check returns the problems it finds (an empty list: the file passes), so a test can show a broken file
being refused as well as a good one passing.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import shlex
import subprocess

import yaml

from tests.conftest import FIXTURES

SCHEMAS = FIXTURES / "schedulers"


@functools.cache
def _trainjob_schema() -> dict:
    packed = (SCHEMAS / "kubeflow" / "trainer.kubeflow.org_trainjobs.yaml.gz").read_bytes()
    crd = yaml.safe_load(gzip.decompress(packed))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


@functools.cache
def _skypilot_validator(name: str):
    """Draft 7 with SkyPilot's case_insensitive_enum keyword, as sky/utils/validator.py extends it."""
    import jsonschema

    def case_insensitive_enum(validator, enums, instance, schema):
        if isinstance(instance, str) and instance.lower() not in [e.lower() for e in enums]:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

    cls = jsonschema.validators.extend(jsonschema.Draft7Validator, {"case_insensitive_enum": case_insensitive_enum})
    return cls(json.loads((SCHEMAS / "skypilot" / f"{name}.json").read_text()))


def _errors(validator, doc, where: str) -> list[str]:
    found = validator.iter_errors(doc)
    return [f"{where}: {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in found]


def _unknown_fields(doc, schema: dict, path: str) -> list[str]:
    """Fields the schema does not name: the API server drops them (structural schemas prune), and kubectl's
    strict field validation (its default since Kubernetes 1.27: --validate=strict) refuses them."""
    if isinstance(doc, list) and "items" in schema:
        return [p for i, item in enumerate(doc) for p in _unknown_fields(item, schema["items"], f"{path}/{i}")]
    if not isinstance(doc, dict) or "properties" not in schema:
        return []
    out = []
    for key, value in doc.items():
        if key in schema["properties"]:
            out += _unknown_fields(value, schema["properties"][key], f"{path}/{key}")
        elif not schema.get("additionalProperties") and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.append(f"TrainJob: {path}/{key}: unknown field")
    return out


def kubeflow_problems(text: str) -> list[str]:
    import jsonschema

    doc = yaml.safe_load(text)
    problems = _errors(jsonschema.Draft7Validator(_trainjob_schema()), doc, "TrainJob")
    problems += _unknown_fields(doc, _trainjob_schema(), "")
    if doc.get("apiVersion") != "trainer.kubeflow.org/v1alpha1" or doc.get("kind") != "TrainJob":
        problems.append(f"not a trainer.kubeflow.org/v1alpha1 TrainJob: {doc.get('apiVersion')} {doc.get('kind')}")
    return problems


def skypilot_problems(text: str) -> list[str]:
    """As sky/task.py checks a task: top-level None dropped, then the task schema; its resources and each
    file_mounts bucket entry against the resources and storage schemas."""
    doc = {k: v for k, v in yaml.safe_load(text).items() if v is not None}
    problems = _errors(_skypilot_validator("task"), doc, "task")
    resources = doc.get("resources") or {}
    problems += _errors(_skypilot_validator("resources"), resources, "resources")
    for target, mount in (doc.get("file_mounts") or {}).items():
        if isinstance(mount, dict):
            problems += _errors(_skypilot_validator("storage"), mount, f"file_mounts {target}")
    return problems


def _names(file: str) -> set[str]:
    return set((SCHEMAS / "slurm" / file).read_text().split())


def slurm_problems(text: str) -> list[str]:
    """Each #SBATCH directive and each option of the srun line is one the man pages document; bash parses it."""
    problems = []
    sbatch = _names("sbatch_options.txt")
    for m in re.finditer(r"^#SBATCH\s+--([a-z0-9-]+)", text, re.M):
        if m.group(1) not in sbatch:
            problems.append(f"#SBATCH --{m.group(1)}: not an option sbatch(1) documents")
    srun = _names("srun_options.txt")
    for line in (ln for ln in text.replace("\\\n", " ").splitlines() if ln.startswith("srun ")):
        for word in shlex.split(line)[1:]:
            if not word.startswith("--"):
                break  # the command srun runs
            if word[2:].partition("=")[0] not in srun:
                problems.append(f"srun {word}: not an option srun(1) documents")
    parsed = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    if parsed.returncode:
        problems.append(f"bash -n: {parsed.stderr.strip()}")
    return problems


PROBLEMS = {"slurm": slurm_problems, "skypilot": skypilot_problems, "kubeflow": kubeflow_problems}
