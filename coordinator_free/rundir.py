"""The run directory: where everything of one run lives, and how files get there.

A run directory is a contract shared by the launchers (which create it), the peers (which
write their logs and results in it), the auditor (which reads it back) and ``cfree report``::

    config.toml                   the exact configuration of the run (after --set overrides)
    roster.json                   public roster: node id, address, public key
    keys/node-<i>.key             private keys (mode 0600)
    logs/node-<i>.vlog            view logs
    logs/node-<i>.stderr          each peer's diagnostics
    results/node-<i>.json         each peer's final estimate (or model quality) and traffic
    results/node-<i>.models.npy   (learning) each peer's model after every round
    results/central.models.npy    (central-DP curator) the model after every round
    metrics.jsonl                 (learning) quality of the node-average model per round
    summary.json                  what ``cfree run`` printed, as JSON
    audit.json                    the auditor's report
    faults.json                   the faults declared for the run, and when each was injected
    interrupted.json              written when the launcher was interrupted (Ctrl-C, SIGTERM)

Spelling these names once means a rename cannot leave a reader looking in the old place.
Every file a reader may open while a run is going (or after a crash) is written atomically:
to a temporary file in the same directory, flushed to disk, then renamed over the target, so a
reader sees the old content or the new, never a torn file.

A leaf module: it imports nothing from the package, so anything may use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

CONFIG = "config.toml"
ROSTER = "roster.json"
KEYS = "keys"
LOGS = "logs"
RESULTS = "results"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
AUDIT = "audit.json"
FILES = "files"  # copies of the graph and data files a portable config refers to


def config_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CONFIG


def roster_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / ROSTER


def keys_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / KEYS


def key_path(key_dir: str | os.PathLike, node: int) -> Path:
    """Node ``node``'s private key inside a key directory (``keys/`` of a run, or a host's)."""
    return Path(key_dir) / f"node-{node}.key"


def logs_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / LOGS


def view_logs(run_dir: str | os.PathLike) -> list[Path]:
    """The view logs present in a run directory (``logs/node-*.vlog``), in name order."""
    return sorted(logs_dir(run_dir).glob("node-*.vlog"))


def log_path(run_dir: str | os.PathLike, node: int) -> Path:
    return logs_dir(run_dir) / f"node-{node}.vlog"


def stderr_path(run_dir: str | os.PathLike, node: int) -> Path:
    return logs_dir(run_dir) / f"node-{node}.stderr"


def results_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RESULTS


def result_path(run_dir: str | os.PathLike, node: int) -> Path:
    return results_dir(run_dir) / f"node-{node}.json"


def models_path(run_dir: str | os.PathLike, node: int) -> Path:
    return results_dir(run_dir) / f"node-{node}.models.npy"


def central_models_path(run_dir: str | os.PathLike) -> Path:
    return results_dir(run_dir) / "central.models.npy"


def metrics_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / METRICS


def summary_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / SUMMARY


def audit_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / AUDIT


def faults_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "faults.json"


def interrupted_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "interrupted.json"


def make_dirs(run_dir: str | os.PathLike) -> None:
    """Create the run directory with its ``logs/`` and ``results/`` (idempotent)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    logs_dir(run_dir).mkdir(exist_ok=True)
    results_dir(run_dir).mkdir(exist_ok=True)


# ------------------------------------------------------------------------------ atomic writes


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write(
    path: str | os.PathLike,
    write: Callable[[IO[bytes]], Any],
    *,
    mode: int = 0o644,
    suffix: str = ".tmp",
) -> None:
    """Write ``path`` through ``write(file)`` atomically.

    The temporary file lives in the target's directory (a rename across file systems would not
    be atomic) under a hidden unique name, is fsynced before the rename and removed if anything
    fails, so an interrupted or failing write leaves the old file (or none) and no temporary.
    ``suffix`` ends the temporary's name (``np.save`` needs ``.npy``).
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> None:
    atomic_write(path, lambda f: f.write(data), mode=mode)


def write_text(path: str | os.PathLike, text: str, *, mode: int = 0o644) -> None:
    write_bytes(path, text.encode(), mode=mode)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1) -> None:
    """JSON as the run directory has always held it (``indent=1``)."""
    text = json.dumps(obj, indent=indent)  # serialise first: a bad object writes nothing
    write_text(path, text)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """One JSON object per line."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    write_text(path, text)


def write_npy(path: str | os.PathLike, array: Any) -> None:
    """A numpy array in ``.npy`` format (no pickles)."""
    import numpy as np

    atomic_write(path, lambda f: np.save(f, array, allow_pickle=False), suffix=".tmp.npy")
