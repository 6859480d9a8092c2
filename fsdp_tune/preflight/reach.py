"""Pre-flight checks that ask the network or the trackers' settings, quickly and once: the rendezvous port is
free, a Hub model that is not cached can be downloaded, the experiment trackers named in --report_to can start
(installed, a wandb key or offline mode, an mlflow server that answers). Each of these otherwise fails on every
rank after launch, after the model has loaded. No torch; every probe is bounded by PROBE_TIMEOUT_S."""

from __future__ import annotations

import errno
import functools
import importlib.util
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.errors import Finding, Severity

PROBE_TIMEOUT_S = 3.0
HUB_ENDPOINT = "https://huggingface.co"
# report_to name -> the modules transformers' integration needs (any one of them)
TRACKER_MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",)}
WANDB_OFFLINE = ("offline", "disabled", "dryrun")


def _err(rule: str, key: str, message: str, hint: str) -> Finding:
    return Finding(rule, Severity.ERROR, key, "command line", message, hint)


def port_in_use(port: int) -> bool:
    """Something on this machine listens on `port` (any address): torchrun's store could not. SO_REUSEADDR as
    the store sets it, so a port a finished run left in TIME_WAIT counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def port_findings(spec: RankSpec) -> list[Finding]:
    """PF027: the rendezvous port machine 0 listens on is taken (a run still going, another program)."""
    w = spec.world
    if w.standalone or w.node_rank != 0 or not w.master_port or not port_in_use(w.master_port):
        return []
    return [
        _err(
            "PF027",
            "--main_process_port",
            f"port {w.master_port} is in use on this machine (EADDRINUSE): torchrun could not listen there",
            f"--main_process_port {w.master_port + 1} (any free port, the same on every machine), or stop what "
            f"holds it (`ss -ltnp 'sport = :{w.master_port}'` names it)",
        )
    ]


@functools.cache
def unreachable(url: str) -> str | None:
    """Why `url`'s server cannot be reached within PROBE_TIMEOUT_S (once per process), or None when it answers
    at all (any HTTP status, even an error, is an answer). Proxies in the environment are used, as the Hub
    client and mlflow use them; a TLS problem is left to them (a custom CA bundle this probe does not read)."""
    try:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError):
            return f"no answer within {PROBE_TIMEOUT_S:g} s"
        if isinstance(reason, OSError) and not _tls(reason):
            return reason.strerror or str(reason)
        return None
    except TimeoutError:
        return f"no answer within {PROBE_TIMEOUT_S:g} s"
    except (OSError, ValueError):
        return None


def _tls(err: OSError) -> bool:
    import ssl

    return isinstance(err, ssl.SSLError)


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")


def hub_findings(name: str) -> list[Finding]:
    """PF003 when not offline: a Hub model that is not cached, with a Hub that does not answer, would have every
    rank retry the download for a minute and fail with a long traceback."""
    endpoint = hub_endpoint()
    why = unreachable(f"{endpoint}/api/models/{name}")
    if why is None:
        return []
    return [
        _err(
            "PF003",
            "--model_name_or_path",
            f"{name} is a Hub id, it is not in the local cache and the Hub ({endpoint}) cannot be reached: {why}",
            f"download it where the Hub answers (`hf download {name}`) into this cache, or point at a local folder",
        )
    ]


def installed(tracker: str) -> bool:
    return any(importlib.util.find_spec(m) is not None for m in TRACKER_MODULES[tracker])


def trackers(cfg: RunConfig) -> tuple[str, ...]:
    """The trackers --report_to starts: those named, or for `all` every one installed (as transformers does)."""
    report_to = cfg.training.get("report_to") or ()
    named = (report_to,) if isinstance(report_to, str) else tuple(report_to)
    if "all" in named:
        return tuple(t for t in TRACKER_MODULES if installed(t))
    return tuple(t for t in named if t in TRACKER_MODULES)


def tracker_findings(cfg: RunConfig) -> list[Finding]:
    """PF024 a tracker's package is missing; PF028 it is installed but cannot start (wandb without a key or an
    offline mode, an mlflow tracking server that does not answer)."""
    found = []
    for tracker in trackers(cfg):
        if not installed(tracker):
            found.append(
                _err(
                    "PF024",
                    "--report_to",
                    f"{tracker} is not installed; the trainer would fail at start",
                    f"pip install {TRACKER_MODULES[tracker][0]}, or drop it from --report_to",
                )
            )
        elif tracker == "wandb":
            found += _wandb()
        elif tracker == "mlflow":
            found += _mlflow()
    return found


def _wandb() -> list[Finding]:
    if os.environ.get("WANDB_MODE", "").lower() in WANDB_OFFLINE or os.environ.get("WANDB_API_KEY"):
        return []
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    if _netrc_has(host):
        return []
    return [
        _err(
            "PF028",
            "--report_to",
            f"wandb has no API key here (WANDB_API_KEY, or {host} in ~/.netrc) and no offline mode: every rank "
            "would stop at the trainer's start, the model already loaded (the ranks have no terminal to ask on)",
            "`wandb login` (or export WANDB_API_KEY), or export WANDB_MODE=offline (`wandb sync` later), "
            "or drop wandb from --report_to",
        )
    ]


def _netrc_has(host: str) -> bool:
    import netrc

    path = Path(os.environ.get("NETRC") or "~/.netrc").expanduser()
    try:
        return bool(host) and netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _mlflow() -> list[Finding]:
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith(("http://", "https://")):
        return []  # local files or a database: mlflow creates them
    why = unreachable(uri)
    if why is None:
        return []
    return [
        _err(
            "PF028",
            "--report_to",
            f"mlflow's tracking server MLFLOW_TRACKING_URI={uri} cannot be reached: {why}",
            "start the server or fix MLFLOW_TRACKING_URI (unset: runs go to local files), or drop mlflow",
        )
    ]
