"""Deterministic randomness: independent numpy streams per (purpose, node, round).

Two sources of streams, with the same interface (``.stream(purpose, node, round)``):

* :class:`NodeSecretStreams` — what a peer uses for everything that must stay private (its
  private demo value, its local noise). The seed material is derived from the node's own
  X25519 private key with HKDF-SHA256, domain-separated by the run id, purpose, node and round,
  and the full 256-bit output seeds the generator (never folded to fewer bits). Nobody without
  the node's private key can recompute the node's noise, even knowing the whole config.
* :class:`PublicSeedStreams` — ``SeedSequence(run.seed, spawn_key=(purpose, node, round))``, for
  pure simulation (``cfree simulate`` without a run directory) where nothing is secret.

Given the same source, peers and the reference simulator draw exactly the same numbers, so a
fault-free networked run can be checked against the simulator bit for bit (the local launcher
holds every key of its run and can rebuild the node streams).
"""

from __future__ import annotations

import struct
from typing import Protocol

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from coordinator_free import rundir

PURPOSE_DATA = 1
PURPOSE_NOISE = 2
PURPOSE_BATCH = 3  # minibatch sampling of the learning protocols
PURPOSE_CLOCK = 4  # randomized gossip: the nodes' Poisson clocks (public streams of the run seed)
PURPOSE_HOP = 5  # token protocols: the holder's draw of the next hop (secret, like its noise)

_INFO = b"coordinator-free/v1 node stream"


class Streams(Protocol):
    def stream(self, purpose: int, node: int, round_: int = 0) -> np.random.Generator: ...


class PublicSeedStreams:
    """Streams from the public run seed: for simulation only, nothing drawn here is secret."""

    def __init__(self, run_seed: int):
        if run_seed < 0:
            raise ValueError("run seed must be non-negative")
        self.run_seed = run_seed

    def stream(self, purpose: int, node: int, round_: int = 0) -> np.random.Generator:
        ss = np.random.SeedSequence(entropy=self.run_seed, spawn_key=(purpose, node, round_))
        return np.random.Generator(np.random.PCG64(ss))


class NodeSecretStreams:
    """Streams only the holder of a node's private key can reproduce."""

    def __init__(self, key: X25519PrivateKey, run_id: bytes, node: int):
        self._ikm = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        self._run_id = bytes(run_id)
        self.node = node

    @property
    def run_id(self) -> bytes:
        return self._run_id

    def derive(self, info: bytes) -> bytes:
        """32 bytes of key material for another purpose of this node's run (HKDF-SHA256 of the
        private key with the run id as salt and ``info`` as context): e.g. the node's X25519
        key for a protocol's pairwise seed exchange."""
        return HKDF(
            algorithm=hashes.SHA256(), length=32, salt=self._run_id, info=bytes(info)
        ).derive(self._ikm)

    def stream(self, purpose: int, node: int, round_: int = 0) -> np.random.Generator:
        if node != self.node:
            raise ValueError(f"node {self.node}'s key cannot seed node {node}'s streams")
        okm = HKDF(
            algorithm=hashes.SHA256(),
            length=32,
            salt=self._run_id,
            info=_INFO + struct.pack(">IIQ", purpose, node, round_),
        ).derive(self._ikm)
        ss = np.random.SeedSequence(entropy=int.from_bytes(okm, "big"))
        return np.random.Generator(np.random.PCG64(ss))


class PerNodeStreams:
    """Dispatch to one :class:`NodeSecretStreams` per node (all keys of a local run)."""

    def __init__(self, by_node: dict[int, NodeSecretStreams]):
        self._by_node = by_node

    def stream(self, purpose: int, node: int, round_: int = 0) -> np.random.Generator:
        return self._by_node[node].stream(purpose, node, round_)

    def node(self, v: int) -> NodeSecretStreams:
        return self._by_node[v]


def streams_of_run(run_dir, n: int) -> PerNodeStreams:
    """The node streams of a local run directory (reads every private key under keys/)."""
    from pathlib import Path

    from coordinator_free import roster as roster_mod

    run_dir = Path(run_dir)
    ros = roster_mod.load_roster(rundir.roster_path(run_dir))
    return PerNodeStreams(
        {
            v: NodeSecretStreams(
                roster_mod.load_private_key(roster_mod.key_path(run_dir / "keys", v)),
                ros.run_id_bytes,
                v,
            )
            for v in range(n)
        }
    )
