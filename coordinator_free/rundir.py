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
import json.encoder
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


#: Containers nested this deep or deeper go on one line in :func:`dumps_json`.
ONE_LINE_DEPTH = 4


def _json_key(key: Any) -> str:
    """A map key as ``json.dumps`` writes it (strings as they are; numbers, booleans and None
    by their JSON text); other keys are refused as ``json.dumps`` refuses them."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _flat_encoder() -> Callable[[Any], str]:
    """``json.dumps`` without an indent, as one reusable function: the C encoder built once
    (``json.JSONEncoder.encode`` builds it again for every call), or the encoder's own
    ``encode`` where the C encoder is missing."""
    base = json.JSONEncoder()
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return base.encode
    iterencode = make(
        {}, base.default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True
    )

    def flat(value: Any) -> str:
        if isinstance(value, str):
            return json.encoder.encode_basestring_ascii(value)
        return "".join(iterencode(value, 0))

    return flat


def dumps_json(obj: Any, *, indent: int = 1, one_line_depth: int = ONE_LINE_DEPTH) -> str:
    """``obj`` as indented JSON, fast: the outer containers laid out as ``json.dumps(obj,
    indent=indent)`` lays them out, and every container nested ``one_line_depth`` deep or more
    on one line, written by the json module's C encoder. ``json.dumps`` with an indent runs its
    pure-Python encoder over every value: a 256-node audit (37 MB, one map per pair and method)
    took 3 s to write that way, 0.9 s this way. Same JSON value, same errors (a value JSON
    cannot hold raises ``TypeError`` and nothing is written); only the line breaks inside deep
    containers differ.
    """
    flat = _flat_encoder()
    out: list[str] = []

    def emit(value: Any, depth: int) -> None:
        if depth >= one_line_depth or not isinstance(value, dict | list | tuple) or not value:
            out.append(flat(value))
            return
        pad = "\n" + " " * (indent * (depth + 1))
        if isinstance(value, dict):
            out.append("{")
            first = True
            for k, v in value.items():
                out.append(pad if first else "," + pad)
                first = False
                out.append(flat(_json_key(k)))
                out.append(": ")
                emit(v, depth + 1)
            out.append("\n" + " " * (indent * depth) + "}")
        else:
            out.append("[")
            for i, v in enumerate(value):
                out.append(pad if i == 0 else "," + pad)
                emit(v, depth + 1)
            out.append("\n" + " " * (indent * depth) + "]")

    emit(obj, 0)
    return "".join(out)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1) -> None:
    """JSON as the run directory holds it: indented (``indent=1``), its deep containers on one
    line each (:func:`dumps_json`); ``indent=None``: all on one line."""
    # Serialise first: a bad object writes nothing.
    text = json.dumps(obj) if indent is None else dumps_json(obj, indent=indent)
    write_text(path, text)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """One JSON object per line."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    write_text(path, text)


def write_npy(path: str | os.PathLike, array: Any) -> None:
    """A numpy array in ``.npy`` format (no pickles)."""
    import numpy as np

    atomic_write(path, lambda f: np.save(f, array, allow_pickle=False), suffix=".tmp.npy")
