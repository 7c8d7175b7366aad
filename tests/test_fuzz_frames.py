"""Fuzzing the sans-IO layers with mutated input.

* **Handshake**: a real initiator and responder exchange M1..M4 while one message in flight is
  mutated (bit flips, byte overwrites, truncation, extension, splices of another handshake's
  message, random bytes), fed at random split points.
* **Frames**: an established pair; the stream of encrypted frames is mutated (bit flips in the
  header, ciphertext or tag, truncation, extension, reordering, replay, dropping a frame,
  splicing a frame of another connection) and fed at random split points, then EOF.
* **Envelope**: ``wire.decode_message`` on mutated valid encodings, on random msgpack objects
  and on random maps with the envelope's field names.

Asserted: nothing escapes but the declared error classes (the ``ChannelError`` family,
``WireError``); a channel that raised is dead; a mutated handshake never completes at either end;
the messages a receiver delivers from a mutated frame stream are exactly the authentic messages
before the first altered frame (no mutated ciphertext ever yields a message); and
``decode_message`` returns a valid ``Message`` (one that survives a re-encoding) or raises
``WireError``.

The slow suite runs over 10,000 cases; the default suite a few hundred.
"""

from __future__ import annotations

import random
from collections import Counter

import msgpack
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from coordinator_free.net.channel import (
    HEADER_SIZE,
    ChannelError,
    HandshakeComplete,
    MessageReceived,
    SecureChannel,
)
from coordinator_free.net.wire import Message, WireError, decode_message, encode_message

RUN = b"fuzz-run"
KEYS = {i: X25519PrivateKey.generate() for i in range(3)}
ROSTER = {i: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for i, k in KEYS.items()}


def pair(a: int = 0, b: int = 1) -> tuple[SecureChannel, SecureChannel]:
    ini = SecureChannel(
        local_id=a,
        static_key=KEYS[a],
        roster_keys=ROSTER,
        run_id=RUN,
        initiator=True,
        peer_id=b,
        max_frame=1 << 16,
    )
    res = SecureChannel(
        local_id=b,
        static_key=KEYS[b],
        roster_keys=ROSTER,
        run_id=RUN,
        initiator=False,
        allowed_peers=[a],
        max_frame=1 << 16,
    )
    return ini, res


def established() -> tuple[SecureChannel, SecureChannel]:
    ini, res = pair()
    ini.start()
    for _ in range(4):
        out = ini.data_to_send()
        if out:
            res.receive_data(out)
        back = res.data_to_send()
        if back:
            ini.receive_data(back)
    assert ini.established and res.established
    return ini, res


def mutate_bytes(rnd: random.Random, data: bytes, pool: list[bytes]) -> tuple[str, bytes]:
    """One random change of ``data``; always returns different bytes."""
    for _ in range(100):
        out = bytearray(data)
        op = rnd.choice(("flip", "overwrite", "truncate", "extend", "splice", "random", "insert"))
        if op == "flip" and out:
            for _ in range(rnd.choice((1, 1, 1, 2, 3))):
                i = rnd.randrange(len(out) * 8)
                out[i // 8] ^= 1 << (i % 8)
        elif op == "overwrite" and out:
            for _ in range(rnd.randrange(1, 4)):
                out[rnd.randrange(len(out))] = rnd.randrange(256)
        elif op == "truncate" and out:
            del out[rnd.randrange(len(out)) :]
        elif op == "extend":
            out += rnd.randbytes(rnd.randrange(1, 40))
        elif op == "splice" and pool:
            other = rnd.choice(pool)
            cut = rnd.randrange(len(out) + 1)
            out = out[:cut] + other[cut:]
        elif op == "random":
            out = bytearray(rnd.randbytes(rnd.randrange(0, 2 * len(data) + 2)))
        elif op == "insert":
            pos = rnd.randrange(len(out) + 1)
            out[pos:pos] = rnd.randbytes(rnd.randrange(1, 6))
        if bytes(out) != data:
            return op, bytes(out)
    raise AssertionError("could not mutate")  # pragma: no cover


def feed(ch: SecureChannel, rnd: random.Random, data: bytes) -> tuple[list, ChannelError | None]:
    """Feed ``data`` at random split points; return the events and the error, if any. Only
    ChannelError may escape ``receive_data``; after one the channel must be dead."""
    events: list = []
    pos = 0
    while pos < len(data):
        step = rnd.choice((1, 3, 13, 29, 64, len(data)))
        chunk = data[pos : pos + step]
        pos += len(chunk)
        try:
            events += ch.receive_data(chunk)
        except ChannelError as exc:
            assert ch.closed, f"channel alive after {type(exc).__name__}: {exc}"
            return events + list(exc.events), exc
    return events, None


# --------------------------------------------------------------------------- handshake


def handshake_pool() -> list[list[bytes]]:
    """The four messages of a few genuine handshakes, as splice material."""
    pools: list[list[bytes]] = [[], [], [], []]
    for _ in range(3):
        ini, res = pair()
        ini.start()
        m1 = ini.data_to_send()
        res.receive_data(m1)
        m2 = res.data_to_send()
        ini.receive_data(m2)
        m3 = ini.data_to_send()
        res.receive_data(m3)
        m4 = res.data_to_send()
        for i, m in enumerate((m1, m2, m3, m4)):
            pools[i].append(m)
    return pools


def fuzz_handshake(rnd: random.Random, pools: list[list[bytes]], stats: Counter) -> None:
    ini, res = pair()
    ini.start()
    target = rnd.randrange(4)  # which message is mutated
    sides = [(ini, res), (res, ini), (ini, res), (res, ini)]  # (sender, receiver) of M1..M4
    tail_after_last = False
    for i, (sender, receiver) in enumerate(sides):
        msg = sender.data_to_send()
        if not msg:
            break
        if i == target:
            original = msg
            op, msg = mutate_bytes(rnd, msg, pools[i])
            stats[f"handshake M{i + 1} {op}"] += 1
            # Bytes appended to the last message a side reads (M3, M4) are, to it, the start of
            # the first frame: TCP is a stream. The handshake itself was genuine.
            tail_after_last = i >= 2 and msg.startswith(original)
        events, err = feed(receiver, rnd, msg)
        if err is not None:
            break
        assert events in ([], [HandshakeComplete(sender.local_id)])
        if i == target and rnd.random() < 0.25:
            # The connection ends right here: a cut-short message or stray bytes must raise.
            with pytest.raises(ChannelError):
                receiver.receive_eof()
            assert receiver.closed
            break
    if tail_after_last:
        # The genuine handshake completed; the stray tail never becomes an event and is
        # refused when the connection ends.
        receiver = res if target == 2 else ini
        if not receiver.closed:
            with pytest.raises(ChannelError):
                receiver.receive_eof()
        return
    # The side that read the mutated bytes never completes, so the two never both do. (Its
    # peer may: a responder has completed before its M4 is mutated, and bytes appended to M2
    # are read after a genuine M2, so the initiator still sends a genuine M3.)
    victim = res if target in (0, 2) else ini
    assert not victim.established, f"M{target + 1} {op} was accepted"
    assert not (ini.established and res.established)


# --------------------------------------------------------------------------- frames


def fuzz_frames(rnd: random.Random, other_frames: list[bytes], stats: Counter) -> None:
    ini, res = established()
    sender, receiver = (ini, res) if rnd.random() < 0.5 else (res, ini)
    payloads = [rnd.randbytes(rnd.randrange(0, 300)) for _ in range(rnd.randrange(1, 7))]
    frames = []
    for p in payloads:
        if rnd.random() < 0.2:
            sender.send_control(p)
        else:
            sender.send(p)
        frames.append(sender.data_to_send())
    stream = list(frames)
    op = rnd.choice(
        ("flip", "flip_header", "truncate", "extend", "reorder", "replay", "drop", "splice")
    )
    if op == "reorder" and len(stream) < 2:
        op = "flip"
    if op in ("flip", "flip_header"):
        k = rnd.randrange(len(stream))
        f = bytearray(stream[k])
        lo, hi = (0, HEADER_SIZE) if op == "flip_header" else (HEADER_SIZE, len(f))
        bit = rnd.randrange(lo * 8, hi * 8)
        f[bit // 8] ^= 1 << (bit % 8)
        stream[k] = bytes(f)
        first_bad = k
    elif op == "truncate":
        k = rnd.randrange(len(stream))
        stream[k] = stream[k][: rnd.randrange(1, len(stream[k]))]  # 0 bytes: a clean close
        del stream[k + 1 :]
        first_bad = k
    elif op == "extend":
        stream.append(rnd.randbytes(rnd.randrange(1, 60)))
        first_bad = len(frames)
    elif op == "reorder":
        i, j = sorted(rnd.sample(range(len(stream)), 2))
        stream[i], stream[j] = stream[j], stream[i]
        first_bad = i
    elif op == "replay":
        k = rnd.randrange(len(stream))
        at = rnd.randrange(k + 1, len(stream) + 1)
        stream.insert(at, stream[k])
        first_bad = at
    elif op == "drop":
        k = rnd.randrange(len(stream))
        del stream[k]
        first_bad = k
        if k == len(stream):  # dropping the last frame is a plain early close: not detectable
            op = "drop-last"
    else:  # a frame of another connection with the right sequence number
        k = rnd.randrange(len(stream))
        stream[k] = other_frames[k % len(other_frames)]
        first_bad = k
    stats[f"frames {op}"] += 1
    events, err = feed(receiver, rnd, b"".join(stream))
    if err is None:
        try:
            receiver.receive_eof()
        except ChannelError as exc:
            err = exc
            assert receiver.closed
    delivered = [
        e.payload for e in events if not isinstance(e, HandshakeComplete)
    ]  # MessageReceived and ControlReceived
    # Authentication: only authentic frames before the first altered one are ever delivered.
    assert len(delivered) <= first_bad, f"{op}: a mutated frame yielded a message"
    assert delivered == payloads[: len(delivered)], f"{op}: delivered bytes differ"
    if op != "drop-last":
        assert err is not None, f"{op}: the mutation went unnoticed"
        assert len(delivered) == first_bad  # and nothing authentic before it was lost
    else:
        assert err is None and len(delivered) == len(stream)
    assert all(isinstance(e, MessageReceived) or hasattr(e, "payload") for e in events)


def other_connection_frames() -> list[bytes]:
    ini, _ = established()
    return [b for p in (b"x", b"yy", b"zzz", b"w" * 40, b"", b"v" * 7) for b in [_frame(ini, p)]]


def _frame(ch: SecureChannel, p: bytes) -> bytes:
    ch.send(p)
    return ch.data_to_send()


# --------------------------------------------------------------------------- envelope

KINDS = ["value", "done", "token", "nope", "", "Value", 1, None]


def random_plain(rnd: random.Random, depth: int = 0):
    choice = rnd.randrange(11 if depth < 3 else 7)
    if choice == 0:
        return None
    if choice == 1:
        return rnd.random() < 0.5
    if choice == 2:
        return rnd.choice((0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), rnd.randrange(1000)))
    if choice == 3:
        return rnd.choice((0.0, -1.5, float("nan"), float("inf"), rnd.random()))
    if choice == 4:
        return rnd.choice(("", "a", "payload", "meta", "v", "é" * 3))
    if choice == 5:
        return rnd.randbytes(rnd.randrange(0, 20))
    if choice == 6:  # array extensions: well-formed, of odd dtype or shape, or random
        dtype = rnd.choice(("<f8", "<i4", "|b1", "|O", ">f8", "<f2", "x"))
        shape = rnd.choice(([2], [0], [1, 3], [], [-1], [2**40], "2"))
        body = msgpack.packb([dtype, shape]) + rnd.randbytes(rnd.choice((0, 3, 8, 16, 24)))
        if rnd.random() < 0.3:
            body = rnd.randbytes(rnd.randrange(0, 30))
        return msgpack.ExtType(rnd.choice((1, 1, 1, 2, 0, 127)), body)
    if choice in (7, 8):
        return [random_plain(rnd, depth + 1) for _ in range(rnd.randrange(0, 4))]
    keys = ["v", "kind", "round", "step", "payload", "meta", "x", 1, b"k"]
    return {rnd.choice(keys): random_plain(rnd, depth + 1) for _ in range(rnd.randrange(0, 7))}


def random_envelope(rnd: random.Random) -> dict:
    env = {
        "v": rnd.choice((1, 1, 1, 2, True, 1.0, "1")),
        "kind": rnd.choice(KINDS),
        "round": rnd.choice((0, 5, -1, 2**63, True, 1.5, "3")),
        "step": rnd.choice((0, 7, -1, 2**64 - 1, None)),
        "payload": rnd.choice((None, None, random_plain(rnd, 2))),
        "meta": rnd.choice(({}, {"a": 1}, random_plain(rnd, 1))),
    }
    if rnd.random() < 0.3:
        del env[rnd.choice(list(env))]
    if rnd.random() < 0.1:
        env["extra"] = 1
    return env


def valid_encodings() -> list[bytes]:
    rng = np.random.default_rng(5)
    return [
        encode_message(Message("value", 1, 2, payload=rng.standard_normal(6))),
        encode_message(Message("done", 0, 0, meta={"a": [1, "b", {"c": None}], "d": b"\x00"})),
        encode_message(Message("token", 9, 3, payload=np.arange(6, dtype="<i4").reshape(2, 3))),
        encode_message(Message("walk_end", 2**40, 1, payload=np.zeros(0, dtype="|u1"))),
    ]


def check_decode(data: bytes) -> bool:
    """True if ``data`` decoded to a message; asserts it is a valid one."""
    try:
        msg = decode_message(data)
    except WireError:
        return False
    assert isinstance(msg, Message)
    assert decode_message(encode_message(msg)) == msg
    return True


def fuzz_envelope(rnd: random.Random, valid: list[bytes], stats: Counter) -> None:
    kind = rnd.randrange(3)
    if kind == 0:
        op, data = mutate_bytes(rnd, rnd.choice(valid), valid)
        stats[f"envelope mutated {op}"] += 1
    elif kind == 1:
        data = msgpack.packb(random_plain(rnd), use_bin_type=True)
        stats["envelope random msgpack"] += 1
    else:
        data = msgpack.packb(random_envelope(rnd), use_bin_type=True)
        stats["envelope random fields"] += 1
    if check_decode(data):
        stats["envelope decoded"] += 1


# --------------------------------------------------------------------------- drivers


def run_fuzz(cases: int, seed: int) -> Counter:
    rnd = random.Random(seed)
    pools = handshake_pool()
    others = other_connection_frames()
    valid = valid_encodings()
    stats: Counter = Counter()
    for i in range(cases):
        which = i % 4
        if which == 0:
            fuzz_handshake(rnd, pools, stats)
        elif which == 1:
            fuzz_frames(rnd, others, stats)
        else:
            fuzz_envelope(rnd, valid, stats)
        stats["cases"] += 1
    return stats


def report(stats: Counter) -> None:
    print(f"\nfuzzed {stats['cases']} cases:")
    for key in sorted(k for k in stats if k != "cases"):
        print(f"  {key}: {stats[key]}")


def test_fuzz_sample():
    stats = run_fuzz(400, seed=20240)
    report(stats)
    assert stats["cases"] == 400
    assert sum(v for k, v in stats.items() if k.startswith("frames ")) == 100


@pytest.mark.slow
def test_fuzz_many():
    stats = run_fuzz(20_000, seed=7)
    report(stats)
    assert stats["cases"] >= 10_000
    # Every kind of mutation was exercised.
    for op in ("flip", "flip_header", "truncate", "extend", "reorder", "replay", "drop", "splice"):
        assert stats[f"frames {op}"] > 50, op
    for m in range(1, 5):
        assert sum(v for k, v in stats.items() if k.startswith(f"handshake M{m} ")) > 100
    assert stats["envelope decoded"] > 0  # the generator does reach valid envelopes
