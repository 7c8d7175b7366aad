"""Deterministic randomness: one run seed, independent streams per (purpose, node, round).

Every stream is a numpy ``Generator`` over PCG64 seeded by ``SeedSequence(run_seed,
spawn_key=(purpose, node, round))``. Peers and the reference simulator draw from exactly the same
streams, so given the same config they produce the same numbers bit for bit, whatever order the
processes start in. Streams for different purposes never overlap (distinct spawn keys).

These streams are for simulation-grade randomness (private data of the demo, local Gaussian
noise). Secrets shared between peers never come from here.
"""

from __future__ import annotations

import numpy as np

PURPOSE_DATA = 1
PURPOSE_NOISE = 2


def stream(run_seed: int, purpose: int, node: int, round_: int = 0) -> np.random.Generator:
    if run_seed < 0:
        raise ValueError("run seed must be non-negative")
    ss = np.random.SeedSequence(entropy=run_seed, spawn_key=(purpose, node, round_))
    return np.random.Generator(np.random.PCG64(ss))
