"""Keyed standard normals that come out bit-identical on every machine.

Why this exists
---------------
DECOR-style correlated noise adds, on each edge ``{u, v}``, a Gaussian vector ``z`` to one end
and ``-z`` to the other, so that the pairwise terms cancel exactly when the models are averaged.
Both ends derive ``z`` on their own from a shared secret key, so they must produce the *same
bits*: a vector that differs in the last place between the two peers leaves a residue that
never cancels. The peers may run on different CPUs, different numpy builds (SIMD dispatch:
SSE2, AVX2, AVX-512, SVML, NEON) and different libm versions. Transcendental functions such as
``np.log``, ``np.cos`` or ``math.log`` are not correctly rounded and their vectorised code paths
are allowed to differ in the last ulp between machines, so none of them is used here.

The randomness is the ChaCha20 keystream of the full 256-bit key (fixed all-zero 16-byte nonce,
i.e. block counter 0 and nonce 0; the caller uses one key per vector). ChaCha20 keeps all 256
bits of the key: never fold a key to fewer bits (e.g. into a 64-bit seed for numpy's
generators), which would both weaken the secret and tie the stream to one library's generator.

Method
------
* The keystream is read as little-endian 64-bit words ``w``; each gives the uniform
  ``u = (w >> 11) * 2**-53`` in [0, 1) with 53-bit resolution, mapped to ``a = 2u - 1`` in
  [-1, 1).
* Marsaglia's polar method on consecutive pairs ``(a, b)`` of words: with ``s = a*a + b*b``,
  pairs with ``s >= 1`` or ``s == 0`` are rejected, the others give the two independent
  normals ``a*f`` and ``b*f`` with ``f = sqrt(-2 ln(s) / s)``. Accepted pairs are kept in stream
  order and the output is truncated to ``count``. The generator draws the keystream in batches
  (about 30% more pairs than needed plus a margin, acceptance is pi/4) and continues the same
  stream if a batch falls short, so the result depends only on ``(key, count)`` and is
  prefix-consistent: ``standard_normals(k, m)[:j] == standard_normals(k, j)`` for ``j <= m``.
* ``ln`` is :func:`det_log`: ``x = m * 2**e`` by :func:`numpy.frexp`, ``m`` renormalised into
  [sqrt(1/2), sqrt(2)), ``f = m - 1``, ``s = f / (2 + f)`` and
  ``ln(1 + f) = 2 atanh(s) = f - (f*f/2 - s*(f*f/2 + R))`` with
  ``R = 2 (s**2/3 + s**4/5 + ...)`` (the identity holds because ``2s = f - s*f``), evaluated by
  Horner with fixed coefficients; then ``e * ln2`` is added as ``e*ln2_hi + e*ln2_lo``.

Exactness argument
------------------
Every step is either exact or a single IEEE-754 basic operation (``+ - * /`` and ``sqrt``),
which the standard requires to be correctly rounded in round-to-nearest-even; numpy's SIMD
kernels for these ufuncs are correctly rounded too, so their results do not depend on the code
path. The rest is exact by construction: ChaCha20 is integer arithmetic, ``w >> 11`` is below
2**53 and converts to float64 exactly, ``2u - 1`` is an integer multiple of 2**-52 of magnitude
at most 1 (exact), :func:`numpy.frexp`, comparisons and :func:`numpy.where` are exact, ``m - 1``
is exact (Sterbenz), multiplications by 2, 0.5 and -2 are exact, and ``e * ln2_hi`` is exact
because ``ln2_hi`` has 42 significant bits and ``|e| <= 1074`` needs 11. Every expression is
written as one numpy ufunc per operation, so no compiler can contract ``a*b + c`` into a fused
multiply-add (which would round once instead of twice and change the bits). In the polar method
``s`` is a sum of squares of nonzero multiples of 2**-52, so ``s >= 2**-104``: no subnormal
numbers arise, and flush-to-zero / denormals-are-zero modes cannot change the result.
Assumptions: float64 arithmetic in the default rounding mode (round to nearest even), which is
what numpy uses on every supported platform.

Accuracy of :func:`det_log` (not needed for bit-identity, only for the quality of the normals):
the main term ``f`` is exact and the correction ``f*f/2 - s*(...)`` is at most about 0.21 |f|,
so its rounding errors stay well below an ulp of the result; the series is truncated after the
``2 s**23 / 23`` term, and the omitted tail is below 2**-60 relative to ``2s`` for
``|s| <= 0.1716``.
The measured error against a high-precision reference is below 1 ulp over (0, 1], subnormal
inputs included.
"""

from __future__ import annotations

import operator

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

__all__ = ["KEY_BYTES", "det_log", "standard_normals"]

KEY_BYTES = 32
"""Key length in bytes: the full 256-bit ChaCha20 key."""

_NONCE = bytes(16)  # ChaCha20 in `cryptography`: 4-byte block counter || 12-byte nonce, all zero

# Largest count accepted. The 32-bit block counter gives 2**38 bytes of keystream; 2**34 normals
# need about 2**34 / 2 pairs * 16 bytes / (pi/4), i.e. 1.75e11 < 2.7e11 bytes.
_MAX_COUNT = 2**34

# Largest number of pairs drawn from the keystream per batch (bounds the temporaries to a few
# tens of MB). The output does not depend on it; the tests lower it to exercise refills.
_MAX_BATCH_PAIRS = 1 << 20
_OVERSAMPLE = 1.3  # acceptance is pi/4 ~ 0.785, so 1.3x pairs almost always suffices
_MARGIN_PAIRS = 16

# ln 2 = _LN2_HI + _LN2_LO; _LN2_HI has 42 significant bits so e * _LN2_HI is exact for
# |e| <= 2**11 (frexp exponents of positive float64 numbers satisfy |e| <= 1074).
_LN2_HI = float.fromhex("0x1.62e42fefa3800p-1")
_LN2_LO = float.fromhex("0x1.ef35793c76730p-45")
_SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")  # only a range split; any nearby value works

# R(z) = 2 * (z/3 + z**2/5 + ... + z**11/23) with z = s*s: the Taylor series of
# 2*atanh(s)/s - 2. Coefficients are 2/(2k+1) rounded to float64 (fixed at import, identical on
# every IEEE-754 machine because division is correctly rounded).
_ATANH_COEFFS = tuple(2.0 / (2 * k + 1) for k in range(1, 12))

_TWO_POW_M52 = 2.0**-52


def _det_log_unchecked(x: np.ndarray) -> np.ndarray:
    """det_log without the domain check; ``x`` must be float64 in (0, 1] (or positive finite)."""
    m, e = np.frexp(x)  # x = m * 2**e, m in [0.5, 1): exact
    small = m < _SQRT_HALF
    m = np.where(small, np.multiply(m, 2.0), m)  # m in [sqrt(1/2), sqrt(2)): exact
    ef = np.subtract(e, small.astype(e.dtype)).astype(np.float64)  # exact
    f = np.subtract(m, 1.0)  # exact (Sterbenz)
    s = np.divide(f, np.add(f, 2.0))
    z = np.multiply(s, s)
    # Horner for R = z * (c1 + z * (c2 + ... + z * c11)), one ufunc per operation.
    acc = np.full_like(z, _ATANH_COEFFS[-1])
    for c in reversed(_ATANH_COEFFS[:-1]):
        acc = np.add(np.multiply(acc, z), c)
    r = np.multiply(acc, z)
    hfsq = np.multiply(np.multiply(f, f), 0.5)
    # ln(x) = e*ln2_hi - ((hfsq - (s*(hfsq + R) + e*ln2_lo)) - f)
    corr = np.add(np.multiply(s, np.add(hfsq, r)), np.multiply(ef, _LN2_LO))
    corr = np.subtract(np.subtract(hfsq, corr), f)
    return np.subtract(np.multiply(ef, _LN2_HI), corr)


def det_log(x: np.ndarray) -> np.ndarray:
    """Natural logarithm of float64 values in (0, 1], bit-identical on every IEEE-754 machine.

    Uses only correctly rounded basic operations (``+ - * /``) and exact ones (``frexp``,
    comparisons, ``where``); no ``np.log``. Subnormal inputs are supported. Error below 2 ulp
    (measured below 1 ulp); ``det_log(1.0) == 0.0`` exactly.

    Raises ValueError if any value is outside (0, 1] or is NaN.
    """
    arr = np.asarray(x, dtype=np.float64)
    if not np.all((arr > 0.0) & (arr <= 1.0)):
        raise ValueError("det_log: every value must lie in (0, 1]")
    return _det_log_unchecked(arr)


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes):
        raise TypeError(f"key must be bytes, not {type(key).__name__}")
    if len(key) != KEY_BYTES:
        raise ValueError(f"key must be exactly {KEY_BYTES} bytes (256 bits), got {len(key)}")


def _check_count(count: int) -> int:
    if isinstance(count, bool):
        raise TypeError("count must be an int, not bool")
    try:
        n = operator.index(count)
    except TypeError:
        raise TypeError(f"count must be an int, not {type(count).__name__}") from None
    if n < 0:
        raise ValueError(f"count must be non-negative, got {n}")
    if n > _MAX_COUNT:
        raise ValueError(f"count must be at most {_MAX_COUNT}, got {n}")
    return n


def _accepted_normals(encryptor, n_pairs: int) -> np.ndarray:
    """The normals from the next ``n_pairs`` pairs of the keystream, in stream order."""
    raw = encryptor.update(bytes(16 * n_pairs))
    words = np.frombuffer(raw, dtype="<u8")
    # a = 2u - 1 with u = (w >> 11) * 2**-53, computed exactly as ((w >> 11) - 2**52) * 2**-52.
    ints = np.subtract(np.right_shift(words, np.uint64(11)).astype(np.int64), np.int64(1 << 52))
    ab = np.multiply(ints.astype(np.float64), _TWO_POW_M52).reshape(n_pairs, 2)
    a = ab[:, 0]
    b = ab[:, 1]
    s = np.add(np.multiply(a, a), np.multiply(b, b))
    keep = (s < 1.0) & (s > 0.0)
    a = a[keep]
    b = b[keep]
    s = s[keep]
    fac = np.sqrt(np.divide(np.multiply(_det_log_unchecked(s), -2.0), s))
    out = np.empty((a.shape[0], 2), dtype=np.float64)
    np.multiply(a, fac, out=out[:, 0])
    np.multiply(b, fac, out=out[:, 1])
    return out.reshape(-1)


def standard_normals(key: bytes, count: int) -> np.ndarray:
    """``count`` standard normal float64 values derived from a 256-bit key.

    The output depends only on ``(key, count)``, is bit-identical across machines, and is a
    prefix-consistent stream: ``standard_normals(k, m)[:j]`` equals ``standard_normals(k, j)``
    for ``j <= m``. Use each key for one vector only (the nonce is fixed).

    Raises TypeError if ``key`` is not ``bytes`` or ``count`` not an int, ValueError if ``key``
    is not exactly :data:`KEY_BYTES` long or ``count`` is negative (or absurdly large).
    """
    _check_key(key)
    n = _check_count(count)
    if n == 0:
        return np.empty(0, dtype=np.float64)
    encryptor = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()
    chunks: list[np.ndarray] = []
    have = 0
    while have < n:
        pairs_needed = (n - have + 1) // 2
        n_pairs = min(int(pairs_needed * _OVERSAMPLE) + _MARGIN_PAIRS, _MAX_BATCH_PAIRS)
        chunk = _accepted_normals(encryptor, n_pairs)
        chunks.append(chunk)
        have += chunk.shape[0]
    out = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    return np.ascontiguousarray(out[:n])
