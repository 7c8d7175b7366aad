"""One networked `cfree run` from a test: real peer processes on loopback, JSON summary back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def cfree_run_json(config: Path, overrides: list[str], out: Path, timeout: float = 240) -> dict:
    """`cfree run CONFIG --set ... --out OUT --json --quiet`; asserts it succeeded."""
    sets = [a for o in overrides for a in ("--set", o)]
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator_free", "run", str(config), *sets]
        + ["--out", str(out), "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
