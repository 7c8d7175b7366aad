"""Deterministic randomness: independent numpy streams per (purpose, node, round).

Two sources of streams, with the same interface (``.stream(purpose, node, round)``):

* :class:`NodeSecretStreams` — what a peer uses for everything that must stay private (its
  private demo value, its local noise, its minibatches, its hop draws). The seed material is
  derived from the node's own X25519 private key with HKDF-SHA256. The salt binds the run: the
  roster's run id, a digest of the run's config (:func:`config_digest`) and a 128-bit nonce the
  peer draws afresh when it starts (:func:`fresh_nonce`), so a second run with the same roster,
  keys and config never draws the same numbers. The info separates purpose, node and round, and
  the full 256-bit output seeds the generator (never folded to fewer bits). Nobody without the
  node's private key can recompute the node's noise, even knowing the whole config and the
  nonce (which is public: the peer writes it to its view log as a ``streams`` record).
* :class:`PublicSeedStreams` — ``SeedSequence(run.seed, spawn_key=(purpose, node, round))``, for
  pure simulation (``cfree simulate`` without a run directory) where nothing is secret.

Given the same source, peers and the reference simulator draw exactly the same numbers, so a
fault-free networked run can be checked against the simulator bit for bit (the local launcher
holds every key of its run and rebuilds the node streams with :func:`streams_of_run`, reading
each node's nonce and config digest from its view log).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import struct
from typing import Any, Protocol

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from coordinator_free import rundir
from coordinator_free.errors import CfreeError
from coordinator_free.viewlog import read_viewlog

PURPOSE_DATA = 1
PURPOSE_NOISE = 2
PURPOSE_BATCH = 3  # minibatch sampling of the learning protocols
PURPOSE_CLOCK = 4  # randomized gossip: the nodes' Poisson clocks (public streams of the run seed)
PURPOSE_HOP = 5  # token protocols: the holder's draw of the next hop (secret, like its noise)

_INFO = b"coordinator-free/v1 node stream"
_SALT = b"coordinator-free/v2 node stream salt"
_PAIR_INFO = b"coordinator-free/v1 pair secret"
_PUBLIC_PAIR_SALT = b"coordinator-free/v1 public pair secret (simulation)"
NONCE_BYTES = 16
DIGEST_BYTES = 32
#: The view-log record in which a peer writes what its streams were derived from.
STREAMS_RECORD = "streams"


class StreamsError(CfreeError, ValueError):
    """A run's node streams cannot be rebuilt (no nonce recorded, a malformed record)."""


def config_digest(cfg: Any) -> bytes:
    """SHA-256 of the config's public parameters (``cfg.to_dict()``, or such a dict), serialised
    canonically: sorted keys, no whitespace, ASCII only, no NaN."""
    data = cfg.to_dict() if hasattr(cfg, "to_dict") else cfg
    text = json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )
    return hashlib.sha256(text.encode("ascii")).digest()


def fresh_nonce() -> bytes:
    """A new 128-bit nonce for a node's streams (from the OS's CSPRNG)."""
    return secrets.token_bytes(NONCE_BYTES)


def _stream_salt(run_id: bytes, digest: bytes, nonce: bytes) -> bytes:
    return hashlib.sha256(_SALT + struct.pack(">I", len(run_id)) + run_id + digest + nonce).digest()


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

    def pair_secret(self, a: int, b: int) -> bytes:
        """A pair's shared secret for simulation: from the public seed, nothing secret."""
        return HKDF(
            algorithm=hashes.SHA256(),
            length=32,
            salt=_PUBLIC_PAIR_SALT,
            info=_pair_info(a, b),
        ).derive(struct.pack(">Q", self.run_seed))

    def node(self, v: int) -> _PublicNode:
        return _PublicNode(self, v)


class _PublicNode:
    """One node's view of :class:`PublicSeedStreams` (the simulator's stand-in for its keys)."""

    def __init__(self, streams: PublicSeedStreams, v: int):
        self._streams, self.node = streams, v

    def stream(self, purpose: int, node: int, round_: int = 0) -> np.random.Generator:
        return self._streams.stream(purpose, node, round_)

    def pair_secret(self, peer: int) -> bytes:
        return self._streams.pair_secret(self.node, peer)


def _pair_info(a: int, b: int) -> bytes:
    lo, hi = sorted((int(a), int(b)))
    return _PAIR_INFO + struct.pack(">II", lo, hi)


class NodeSecretStreams:
    """Streams only the holder of a node's private key can reproduce.

    ``config_digest`` (32 bytes, :func:`config_digest`) and ``nonce`` (16 bytes, drawn by the
    peer at start with :func:`fresh_nonce`) make the streams of every run distinct, even with
    the same roster, keys and config."""

    def __init__(
        self,
        key: X25519PrivateKey,
        run_id: bytes,
        node: int,
        *,
        config_digest: bytes,
        nonce: bytes,
    ):
        self._ikm = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        self._run_id = bytes(run_id)
        if len(config_digest) != DIGEST_BYTES:
            raise StreamsError(f"a config digest is {DIGEST_BYTES} bytes, got {len(config_digest)}")
        if len(nonce) != NONCE_BYTES:
            raise StreamsError(f"a stream nonce is {NONCE_BYTES} bytes, got {len(nonce)}")
        self.config_digest, self.nonce = bytes(config_digest), bytes(nonce)
        self._salt = _stream_salt(self._run_id, self.config_digest, self.nonce)
        self.node = node
        self._key = key
        #: The roster's public keys (node -> 32 raw bytes), for :meth:`pair_secret`.
        self.peer_keys: dict[int, bytes] = {}

    def record(self) -> dict[str, str]:
        """The fields of the node's ``streams`` view-log record: what its streams were derived
        from besides its private key (public values: useless without the key)."""
        return {"nonce": self.nonce.hex(), "config_digest": self.config_digest.hex()}

    @property
    def run_id(self) -> bytes:
        return self._run_id

    def derive(self, info: bytes) -> bytes:
        """32 bytes of key material for another purpose of this node's run (HKDF-SHA256 of the
        private key with the run's salt and ``info`` as context): e.g. the node's X25519 key for
        a protocol's pairwise seed exchange."""
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=self._salt, info=bytes(info)).derive(
            self._ikm
        )

    def pair_secret(self, peer: int) -> bytes:
        """The secret this node shares with ``peer`` for the run: X25519 of its private key and
        the peer's public key from the roster, through HKDF with the run id as salt. The peer
        computes the same from its side; nobody else can (it needs one of the two private
        keys). Bound to the run and the pair, not to the streams' nonce."""
        raw = self.peer_keys.get(int(peer))
        if raw is None:
            raise StreamsError(f"node {self.node} has no public key of node {peer}")
        shared = self._key.exchange(X25519PublicKey.from_public_bytes(raw))
        return HKDF(
            algorithm=hashes.SHA256(),
            length=32,
            salt=self._run_id,
            info=_pair_info(self.node, peer),
        ).derive(shared)

    def stream(self, purpose: int, node: int, round_: int = 0) -> np.random.Generator:
        if node != self.node:
            raise ValueError(f"node {self.node}'s key cannot seed node {node}'s streams")
        okm = HKDF(
            algorithm=hashes.SHA256(),
            length=32,
            salt=self._salt,
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


def read_streams_record(log_path) -> tuple[bytes, bytes]:
    """(nonce, config digest) from the ``streams`` record of a node's view log."""
    try:
        log = read_viewlog(log_path)
    except FileNotFoundError:
        raise StreamsError(
            f"{log_path} does not exist: the node's streams cannot be rebuilt without the "
            "nonce it drew"
        ) from None
    found = log.of_kind(STREAMS_RECORD)
    if len(found) != 1:
        raise StreamsError(
            f"{log_path}: expected one {STREAMS_RECORD!r} record (the node's stream nonce), "
            f"found {len(found)}"
        )
    rec = found[0]
    try:
        nonce = bytes.fromhex(rec["nonce"])
        digest = bytes.fromhex(rec["config_digest"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StreamsError(f"{log_path}: malformed {STREAMS_RECORD!r} record: {exc}") from None
    if len(nonce) != NONCE_BYTES or len(digest) != DIGEST_BYTES:
        raise StreamsError(
            f"{log_path}: the {STREAMS_RECORD!r} record needs a {NONCE_BYTES}-byte nonce and a "
            f"{DIGEST_BYTES}-byte config digest"
        )
    return nonce, digest


class _Unrecoverable:
    """A node whose streams cannot be rebuilt (it never wrote its nonce): any use says why."""

    def __init__(self, node: int, why: str):
        self.node, self._why = node, why

    def __getattr__(self, name: str):
        raise StreamsError(f"node {self.node}'s streams cannot be rebuilt: {self._why}")

    def stream(self, purpose: int, node: int, round_: int = 0) -> np.random.Generator:
        raise StreamsError(f"node {self.node}'s streams cannot be rebuilt: {self._why}")


#: The last run whose streams :func:`streams_of_run` rebuilt: (what its files were, the streams).
_last_streams: tuple[tuple, PerNodeStreams] | None = None


def _files_state(run_dir, n: int) -> tuple:
    """What :func:`streams_of_run` reads, as the file system describes it (size, modification
    time and inode of the roster, every private key and every view log): equal states give
    equal streams."""
    import os
    from pathlib import Path

    keys = rundir.keys_dir(run_dir)
    paths = [rundir.roster_path(run_dir)]
    paths += [rundir.key_path(keys, v) for v in range(n)]
    paths += [rundir.log_path(run_dir, v) for v in range(n)]
    state: list = [str(Path(run_dir).resolve()), n]
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            state.append(None)
        else:
            state.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(state)


def streams_of_run(run_dir, n: int) -> PerNodeStreams:
    """The node streams of a local run directory: every private key under keys/, each node's
    nonce and config digest from the ``streams`` record of its view log. A node that never
    wrote one (it did not start) raises :class:`StreamsError` when its streams are used.

    Reading every view log is most of the cost; the launcher asks twice after a run (the
    inputs, the simulator), so the last run's streams are kept while none of its files
    changed."""
    global _last_streams
    state = _files_state(run_dir, n)
    if _last_streams is not None and _last_streams[0] == state:
        return _last_streams[1]
    streams = _read_streams_of_run(run_dir, n)
    _last_streams = (state, streams)
    return streams


def _read_streams_of_run(run_dir, n: int) -> PerNodeStreams:
    from pathlib import Path

    from coordinator_free import roster as roster_mod

    run_dir = Path(run_dir)
    ros = roster_mod.load_roster(rundir.roster_path(run_dir))
    by_node: dict[int, NodeSecretStreams] = {}
    for v in range(n):
        try:
            nonce, digest = read_streams_record(rundir.log_path(run_dir, v))
        except StreamsError as exc:
            by_node[v] = _Unrecoverable(v, str(exc))  # type: ignore[assignment]
            continue
        by_node[v] = NodeSecretStreams(
            roster_mod.load_private_key(roster_mod.key_path(run_dir / "keys", v)),
            ros.run_id_bytes,
            v,
            config_digest=digest,
            nonce=nonce,
        )
        by_node[v].peer_keys = {e.id: e.public_key for e in ros.entries}
    return PerNodeStreams(by_node)
