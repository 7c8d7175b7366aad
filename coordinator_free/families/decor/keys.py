"""DECOR: pair secrets from an X25519 exchange and pairwise-cancelling correlated noise.

Round r of ``decor`` at node i (Algorithm 1 of the DECOR paper; docs/privacy.md §11):

    g_i       = clipped gradient of i's batch
    c_i^r     = sum over the pairs {i, j} active this round of  s_ij z_ij^r,
                z_ij^r ~ N(0, sigma_cor^2 I) drawn from the pair's secret, s_ij = +1 if i < j else -1
    thetahat  = theta_i - nu (g_i + vbar_i^r + c_i^r + l2 theta_i),    vbar_i^r ~ N(0, sigma^2 I)
    theta_i   = sum_j W_ij thetahat_j                    (one gossip step, as in D-SGD)

Both ends of an edge draw the same ``z_ij^r`` with opposite signs, so when both add it the terms
cancel in the network sum: the network average carries only the independent noise ``vbar``.

Secrets, from the node's private key down to the Gaussian vector:

1. **Exchange key.** Each node derives an X25519 key for the run's seed exchange from its own
   private key (HKDF, salt = run id; nobody without the private key can compute it) and sends
   the public half to each neighbour over the authenticated, encrypted channel: one round.
2. **Pair secret.** ``s_ij = HKDF(X25519(k_i, K_j), salt = run id, info = (lo, hi))``, 256
   bits, identical at both ends and bound to the run and the ordered edge.
3. **Per-round keys.** ``HKDF(s_ij, salt = run id, info = (lo, hi, round, purpose))``: one key for
   the noise of every round (fresh noise every round), one for the round's commitment.
4. **Gaussians.** The noise key is the full 256-bit key of a ChaCha20 keystream turned into
   normals with operations that are exactly rounded on every machine
   (:mod:`coordinator_free.keyed_normal`), so the two ends' vectors are bit-identical.

The view log records, per round, which pairs a node used and a commitment per pair (16 bytes
of a key derived for that purpose only): equal commitments at both ends prove both used the same
secret that round, and reveal nothing about the noise. Secrets never reach a log.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from coordinator_free import seeds
from coordinator_free.keyed_normal import standard_normals

PURPOSE_NOISE = 1
PURPOSE_COMMIT = 2
PURPOSE_PAIR = 3  # the pair's commitment at the seed exchange (logged once per pair)

_DH_INFO = b"coordinator-free/v1 decor exchange key"
_PAIR_INFO = b"coordinator-free/v1 decor pair"
_EDGE_INFO = b"coordinator-free/v1 decor edge"
_PUBLIC_INFO = b"coordinator-free/v1 decor public simulation"


class DecorKeyError(ValueError):
    """A seed exchange that cannot give a pair secret (bad public key, low-order point)."""


def _hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(ikm)


def _edge(a: int, b: int) -> tuple[int, int]:
    if a == b:
        raise ValueError(f"a pair needs two distinct nodes, got {a} twice")
    return (a, b) if a < b else (b, a)


def exchange_key(node_streams: seeds.NodeSecretStreams) -> X25519PrivateKey:
    """The node's X25519 key for this run's seed exchange (derived from its private key)."""
    return X25519PrivateKey.from_private_bytes(node_streams.derive(_DH_INFO))


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def pair_secret(own: X25519PrivateKey, peer_public: bytes, run_id: bytes, a: int, b: int) -> bytes:
    """The 256-bit secret of the pair {a, b}, the same at both ends."""
    lo, hi = _edge(a, b)
    if not isinstance(peer_public, (bytes, bytearray)) or len(peer_public) != 32:
        raise DecorKeyError(f"the public exchange key of pair {lo}-{hi} must be 32 bytes")
    try:
        shared = own.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError as exc:  # an all-zero shared secret: a low-order point was sent
        raise DecorKeyError(f"pair {lo}-{hi}: unusable public exchange key ({exc})") from None
    return _hkdf(shared, run_id, _PAIR_INFO + struct.pack(">QQ", lo, hi))


def edge_key(secret: bytes, run_id: bytes, a: int, b: int, round_: int, purpose: int) -> bytes:
    lo, hi = _edge(a, b)
    return _hkdf(secret, run_id, _EDGE_INFO + struct.pack(">QQQI", lo, hi, round_, purpose))


def commitment(secret: bytes, run_id: bytes, a: int, b: int, round_: int) -> str:
    """What the log holds for pair {a, b} at a round: 16 bytes of a key derived for that only."""
    return edge_key(secret, run_id, a, b, round_, PURPOSE_COMMIT)[:16].hex()


def pair_commitment(secret: bytes, run_id: bytes, a: int, b: int) -> str:
    """The commitment logged once when the pair secret is established."""
    return edge_key(secret, run_id, a, b, 0, PURPOSE_PAIR)[:16].hex()


def edge_noise(
    secret: bytes, run_id: bytes, a: int, b: int, round_: int, dim: int, sigma_cor: float
) -> np.ndarray:
    """z_ab^r: the pair's Gaussian vector of round r (std sigma_cor), unsigned."""
    if sigma_cor == 0.0:
        return np.zeros(dim)
    key = edge_key(secret, run_id, a, b, round_, PURPOSE_NOISE)
    return sigma_cor * standard_normals(key, dim)


def correlated_noise(v: int, peers: Iterable[int], z_of, dim: int) -> np.ndarray:
    """c_v^r = sum over ``peers`` (increasing id) of +z if v is the lower id, -z otherwise;
    ``z_of(peer)`` gives the pair's vector of the round (:func:`edge_noise`). Peers and the
    simulator both sum through here, so their terms are bit-identical."""
    total = np.zeros(dim)
    for j in sorted(peers):
        z = z_of(j)
        total = total + z if v < j else total - z
    return total


class PairSecrets:
    """Every pair secret of a run, for the simulator and the tests: computed from all the
    nodes' private keys (a local run) or from the public run seed (pure simulation, where
    nothing is secret)."""

    def __init__(self, run_id: bytes, secrets: dict[tuple[int, int], bytes]):
        self.run_id = bytes(run_id)
        self._secrets = secrets

    def secret(self, a: int, b: int) -> bytes:
        return self._secrets[_edge(a, b)]

    @classmethod
    def of_streams(cls, streams, edges: Iterable[tuple[int, int]]) -> PairSecrets:
        """From the streams a simulation uses: the node keys of a local run
        (:class:`seeds.PerNodeStreams`, each pair computed at both ends and checked equal) or
        the public run seed."""
        if isinstance(streams, seeds.PerNodeStreams):
            run_id, out = None, {}
            for a, b in edges:
                sa, sb = streams.node(a), streams.node(b)
                run_id = sa.run_id
                ka, kb = exchange_key(sa), exchange_key(sb)
                s1 = pair_secret(ka, public_bytes(kb), run_id, a, b)
                s2 = pair_secret(kb, public_bytes(ka), run_id, b, a)
                if s1 != s2:  # pragma: no cover - X25519 is commutative
                    raise DecorKeyError(f"pair {a}-{b}: the two ends disagree")
                out[_edge(a, b)] = s1
            return cls(run_id or b"", out)
        if isinstance(streams, seeds.PublicSeedStreams):
            run_id = b"public:" + str(streams.run_seed).encode()
            out = {
                _edge(a, b): hashlib.sha256(
                    _PUBLIC_INFO + struct.pack(">QQQ", streams.run_seed, *_edge(a, b))
                ).digest()
                for a, b in edges
            }
            return cls(run_id, out)
        raise TypeError(f"no pair secrets for streams of type {type(streams).__name__}")
