"""Sans-IO secure channel: handshake, authentication failures, frame integrity, the dup-dial rule.

Two SecureChannel objects are wired back to back in memory; no sockets.
"""

from __future__ import annotations

import itertools
import random
import struct

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from coordinator_free.net.channel import (
    AES_256_GCM,
    CHACHA20_POLY1305,
    HEADER_SIZE,
    M1_SIZE,
    M2_SIZE,
    MAX_SEQ,
    TAG_SIZE,
    AuthenticationError,
    ChannelClosed,
    ChannelError,
    ControlReceived,
    CounterExhausted,
    DupAction,
    FrameError,
    FrameTooLarge,
    HandshakeComplete,
    HandshakeError,
    MessageReceived,
    PeerRejected,
    SecureChannel,
    cipher_suites,
    cpu_has_aes,
    dup_dial_action,
    edge_leader,
    run_tag,
)

RUN = b"run-0001"


def pub(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


@pytest.fixture(scope="module")
def keys() -> dict[int, X25519PrivateKey]:
    return {i: X25519PrivateKey.generate() for i in range(5)}


@pytest.fixture(scope="module")
def roster(keys) -> dict[int, bytes]:
    return {i: pub(k) for i, k in keys.items()}


def make_pair(keys, roster, *, a=0, b=1, allowed=None, run_a=RUN, run_b=RUN, **kw):
    ini = SecureChannel(
        local_id=a,
        static_key=keys[a],
        roster_keys=roster,
        run_id=run_a,
        initiator=True,
        peer_id=b,
        **kw,
    )
    res = SecureChannel(
        local_id=b,
        static_key=keys[b],
        roster_keys=roster,
        run_id=run_b,
        initiator=False,
        allowed_peers=allowed,
        **kw,
    )
    return ini, res


def pump(ini: SecureChannel, res: SecureChannel) -> tuple[list, list]:
    """Shuttle bytes until both sides are quiet; return (initiator events, responder events)."""
    ev_i: list = []
    ev_r: list = []
    ini.start()
    for _ in range(10):
        out = ini.data_to_send()
        if out:
            ev_r += res.receive_data(out)
        back = res.data_to_send()
        if back:
            ev_i += ini.receive_data(back)
        if not out and not back:
            break
    return ev_i, ev_r


def established_pair(keys, roster, **kw):
    ini, res = make_pair(keys, roster, **kw)
    ev_i, ev_r = pump(ini, res)
    assert ev_i == [HandshakeComplete(1)] and ev_r == [HandshakeComplete(0)]
    return ini, res


def frames(ch: SecureChannel, *payloads: bytes) -> list[bytes]:
    out = []
    for p in payloads:
        ch.send(p)
        out.append(ch.data_to_send())
    return out


def assert_dead(ch: SecureChannel) -> None:
    assert ch.closed and not ch.established
    with pytest.raises(ChannelClosed):
        ch.receive_data(b"x")
    with pytest.raises(ChannelClosed):
        ch.send(b"x")


# --------------------------------------------------------------------------- happy path


def test_handshake_and_messages_both_ways(keys, roster):
    ini, res = established_pair(keys, roster)
    assert ini.established and res.established
    assert ini.peer_id == 1 and res.peer_id == 0
    ini.send(b"hello")
    res.send(b"")
    res.send_control(b"select")
    assert res.receive_data(ini.data_to_send()) == [MessageReceived(b"hello")]
    assert ini.receive_data(res.data_to_send()) == [
        MessageReceived(b""),
        ControlReceived(b"select"),
    ]
    assert ini.frames_sent == 1 and res.frames_received == 1
    assert ini.frames_received == 2


def test_wire_sizes(keys, roster):
    ini, res = make_pair(keys, roster)
    ini.start()
    m1 = ini.data_to_send()
    assert len(m1) == M1_SIZE == 64
    res.receive_data(m1)
    assert len(res.data_to_send()) == M2_SIZE == 50
    ini, res = established_pair(keys, roster)
    ini.send(b"abc")
    frame = ini.data_to_send()
    assert len(frame) == HEADER_SIZE + 3 + TAG_SIZE
    assert struct.unpack(">I", frame[:4])[0] == 3 + TAG_SIZE
    assert b"abc" not in frame


def test_each_connection_has_fresh_keys(keys, roster):
    a1, _ = established_pair(keys, roster)
    a2, _ = established_pair(keys, roster)
    a1.send(b"same plaintext")
    a2.send(b"same plaintext")
    assert a1.data_to_send() != a2.data_to_send()


def test_byte_at_a_time_fragmentation(keys, roster):
    ini, res = make_pair(keys, roster)
    ini.start()
    ev_i: list = []
    ev_r: list = []
    for _ in range(4):
        for byte in ini.data_to_send():
            ev_r += res.receive_data(bytes([byte]))
        for byte in res.data_to_send():
            ev_i += ini.receive_data(bytes([byte]))
    assert ev_i == [HandshakeComplete(1)] and ev_r == [HandshakeComplete(0)]
    payloads = [bytes([i]) * (i * 37) for i in range(6)]
    data = b"".join(frames(ini, *payloads))
    got: list = []
    for i in range(len(data)):
        before = res.bytes_needed()
        got += res.receive_data(data[i : i + 1])
        assert before >= 1
    assert got == [MessageReceived(p) for p in payloads]
    assert res.bytes_needed() == HEADER_SIZE and not res.mid_frame


def test_coalesced_handshake_tail_and_frames(keys, roster):
    """M4 and the responder's first frames arrive in one read; many frames in one feed."""
    ini, res = make_pair(keys, roster)
    ini.start()
    res.receive_data(ini.data_to_send())
    ini.receive_data(res.data_to_send())
    res.receive_data(ini.data_to_send())  # M3: responder established, M4 queued
    assert res.established
    res.send(b"one")
    res.send(b"two")
    events = ini.receive_data(res.data_to_send())
    assert events == [HandshakeComplete(1), MessageReceived(b"one"), MessageReceived(b"two")]
    many = [i.to_bytes(4, "big") for i in range(500)]
    data = b"".join(frames(ini, *many))
    assert res.receive_data(data) == [MessageReceived(p) for p in many]


def test_bytes_needed_guides_exact_reads(keys, roster):
    ini, res = make_pair(keys, roster)
    assert res.bytes_needed() == 4  # the magic first, so strangers are refused early
    res.receive_data(b"CFCH")
    assert res.bytes_needed() == M1_SIZE - 4
    ini.start()
    assert ini.bytes_needed() == M2_SIZE
    ini2, res2 = established_pair(keys, roster)
    ini2.send(b"x" * 1000)
    data = ini2.data_to_send()
    assert res2.bytes_needed() == HEADER_SIZE
    res2.receive_data(data[:HEADER_SIZE])
    assert res2.mid_frame and res2.bytes_needed() == 1000 + TAG_SIZE
    assert res2.receive_data(data[HEADER_SIZE:]) == [MessageReceived(b"x" * 1000)]


def test_random_split_points(keys, roster):
    rnd = random.Random(5)
    ini, res = established_pair(keys, roster)
    payloads = [rnd.randbytes(rnd.randrange(0, 3000)) for _ in range(50)]
    data = b"".join(frames(ini, *payloads))
    got: list = []
    pos = 0
    while pos < len(data):
        step = rnd.randrange(1, 700)
        got += res.receive_data(data[pos : pos + step])
        pos += step
    assert got == [MessageReceived(p) for p in payloads]


def _read_into(ch: SecureChannel, data: bytes, rnd: random.Random, most: int) -> list:
    """Feed ``data`` as a socket would into the channel's own buffer: each read fills part of
    the room the channel offers (at most ``most`` bytes, at random)."""
    got: list = []
    pos = 0
    while pos < len(data):
        room = ch.receive_space()
        assert len(room) > 0
        n = min(len(room), len(data) - pos, rnd.randrange(1, most + 1))
        room[:n] = data[pos : pos + n]
        room.release()
        got += ch.receive_into(n)
        pos += n
    return got


@pytest.mark.parametrize("most", [1, 13, 700, 1 << 22])
def test_own_buffer_reads_in_place_at_any_split(keys, roster, most):
    """Frames read into the channel's own buffer, split anywhere (a byte at a time, at header
    size, in pieces, or as much as the room allows), with frames larger than the buffer
    among them (it grows) and the start of the next frame held behind the end of one (moved
    to the front): the same messages as receive_data, in order."""
    rnd = random.Random(most)
    ini, res = established_pair(keys, roster)
    sizes = [0, 1, 100, 9000, 3 << 20, 5, 70000, 2, 1 << 20]
    if most <= 13:
        sizes = [0, 1, 100, 9000, 5, 20000]  # a few bytes at a time: no megabytes
    payloads = [rnd.randbytes(n) for n in sizes]
    res.own_buffer()
    assert res.bytes_needed() == HEADER_SIZE and not res.mid_frame
    assert _read_into(res, b"".join(frames(ini, *payloads)), rnd, most) == [
        MessageReceived(p) for p in payloads
    ]
    assert not res.mid_frame and res.bytes_needed() == HEADER_SIZE


def test_own_buffer_takes_the_bytes_already_held(keys, roster):
    """A frame part-way in when the channel switches to its own buffer completes there; the
    room offered covers the rest of the frame once the buffer is that large; the room is
    checked."""
    ini, res = established_pair(keys, roster)
    first, second = frames(ini, b"a" * 50_000, b"bb")
    res.receive_data(first[:20])
    assert res.mid_frame
    res.own_buffer()
    assert res.bytes_needed() == len(first) - 20
    room = res.receive_space()
    assert 4096 <= len(room) < 20_000  # the first 8 KiB: not the frame's 50 kB
    with pytest.raises(ValueError, match="do not fit"):
        res.receive_into(len(room) + 1)
    room.release()
    with pytest.raises(ValueError, match="own buffer"):
        res.receive_data(b"x")
    got = _read_into(res, first[20:] + second, random.Random(1), 1 << 20)
    assert got == [MessageReceived(b"a" * 50_000), MessageReceived(b"bb")]
    # The buffer is now frame-sized: a frame like it gets all its room at once.
    (third,) = frames(ini, b"c" * 50_000)
    room = res.receive_space()
    assert len(room) >= len(third)
    room[: len(third)] = third
    room.release()
    assert res.receive_into(len(third)) == [MessageReceived(b"c" * 50_000)]


def test_own_buffer_grows_with_what_arrives_not_with_what_is_announced(keys, roster):
    """A header announcing a large frame, then a few bytes at a time, and room asked for again
    and again without a byte arriving: the buffer stays within twice the bytes held and a
    read's room, however large the frame announced. A frame-sized buffer of more than
    RECV_KEEP is given back once its frame is consumed."""
    ini, res = established_pair(keys, roster, max_frame=64 << 20)
    res.own_buffer()
    (big,) = frames(ini, bytes(40 << 20))
    held = 0
    for piece in (HEADER_SIZE, 1, 1, 100, 5000, 1, 20_000):
        for _ in range(5):  # asking again without new bytes changes nothing
            room = res.receive_space()
            assert len(room) >= 4096
            size = res._end + len(room)  # the buffer's size, from the front
            assert size <= max(8192, 2 * held + 2 * 4096), (held, size)
            room.release()
        while piece:
            room = res.receive_space()
            n = min(piece, len(room))
            room[:n] = big[held : held + n]
            room.release()
            assert res.receive_into(n) == []
            held += n
            piece -= n
    assert res.mid_frame and res.bytes_needed() == len(big) - held
    got = _read_into(res, big[held:], random.Random(5), 1 << 30)
    assert got == [MessageReceived(bytes(40 << 20))]
    assert len(res.receive_space()) < 1 << 20  # 40 MiB given back


def test_own_buffer_end_of_stream_and_damage(keys, roster):
    """In its own buffer, a frame cut short by the end of the stream, and a tampered frame,
    fail as they do with receive_data; a complete stream ends cleanly."""
    ini, res = established_pair(keys, roster)
    (frame,) = frames(ini, b"x" * 1000)
    res.own_buffer()
    _read_into(res, frame[:500], random.Random(2), 100)
    with pytest.raises(FrameError, match=r"middle of frame 0 \(500 bytes received of 1029"):
        res.receive_eof()
    assert_dead(res)

    ini, res = established_pair(keys, roster)
    good, bad = frames(ini, b"ok", b"no")
    bad = bad[:-1] + bytes([bad[-1] ^ 1])
    res.own_buffer()
    with pytest.raises(FrameError, match="failed authentication") as err:
        _read_into(res, good + bad, random.Random(3), 1 << 20)
    assert err.value.events == (MessageReceived(b"ok"),)
    assert_dead(res)

    ini, res = established_pair(keys, roster)
    res.own_buffer()
    _read_into(res, b"".join(frames(ini, b"1", b"2")), random.Random(4), 7)
    res.receive_eof()
    assert res.closed


def test_own_buffer_only_when_established(keys, roster):
    ini, res = make_pair(keys, roster)
    with pytest.raises(ValueError, match="established"):
        res.own_buffer()
    with pytest.raises(ValueError, match="own_buffer first"):
        res.receive_space()


# --------------------------------------------------------------------------- authentication


def test_initiator_without_the_claimed_key_is_refused(keys, roster):
    """An impostor claims node 2 (a roster member) but holds another key."""
    fake = X25519PrivateKey.generate()
    own_view = {**roster, 2: pub(fake)}  # the impostor's roster has to list its own key
    ini = SecureChannel(
        local_id=2, static_key=fake, roster_keys=own_view, run_id=RUN, initiator=True, peer_id=1
    )
    res = SecureChannel(
        local_id=1, static_key=keys[1], roster_keys=roster, run_id=RUN, initiator=False
    )
    ini.start()
    res.receive_data(ini.data_to_send())
    ini.receive_data(res.data_to_send())  # the responder is genuine, so M2 verifies
    with pytest.raises(AuthenticationError, match="claiming node 2 did not prove"):
        res.receive_data(ini.data_to_send())
    assert_dead(res)
    assert res.data_to_send() == b""  # no confirmation leaks out


def test_responder_impersonation_is_detected(keys, roster):
    """Someone answers a dial to node 1 without node 1's key."""
    fake = X25519PrivateKey.generate()
    ini = SecureChannel(
        local_id=0, static_key=keys[0], roster_keys=roster, run_id=RUN, initiator=True, peer_id=1
    )
    res = SecureChannel(
        local_id=1,
        static_key=fake,
        roster_keys={**roster, 1: pub(fake)},
        run_id=RUN,
        initiator=False,
    )
    ini.start()
    res.receive_data(ini.data_to_send())
    with pytest.raises(AuthenticationError, match="did not prove it holds node 1's roster key"):
        ini.receive_data(res.data_to_send())
    assert_dead(ini)
    assert ini.data_to_send() == b""


def test_other_roster_member_cannot_answer_for_the_dialled_node(keys, roster):
    """A dial to node 1 reaches node 3 (say, a stale address). Node 3 refuses; and if it lied
    about its id, the initiator would refuse it."""
    ini = SecureChannel(
        local_id=0, static_key=keys[0], roster_keys=roster, run_id=RUN, initiator=True, peer_id=1
    )
    res = SecureChannel(
        local_id=3, static_key=keys[3], roster_keys=roster, run_id=RUN, initiator=False
    )
    ini.start()
    with pytest.raises(PeerRejected, match="dialled node 1, but this is node 3"):
        res.receive_data(ini.data_to_send())


def test_unknown_initiator_id(keys, roster):
    stranger = X25519PrivateKey.generate()
    ini = SecureChannel(
        local_id=99,
        static_key=stranger,
        roster_keys={**roster, 99: pub(stranger)},
        run_id=RUN,
        initiator=True,
        peer_id=1,
    )
    res = SecureChannel(
        local_id=1, static_key=keys[1], roster_keys=roster, run_id=RUN, initiator=False
    )
    ini.start()
    with pytest.raises(PeerRejected, match="node id 99, which is not in the roster"):
        res.receive_data(ini.data_to_send())
    assert res.peer_id == 99  # claimed, for the log
    assert_dead(res)


def test_non_neighbour_is_refused(keys, roster):
    ini, res = make_pair(keys, roster, a=4, b=1, allowed={0, 2})
    ini.start()
    with pytest.raises(PeerRejected, match="node 4 is not an allowed peer"):
        res.receive_data(ini.data_to_send())
    assert_dead(res)


def test_allowed_neighbour_is_accepted(keys, roster):
    ini, res = make_pair(keys, roster, a=0, b=1, allowed={0})
    ev_i, ev_r = pump(ini, res)
    assert ev_r == [HandshakeComplete(0)]


def test_initiator_claiming_responder_id_is_refused(keys, roster):
    ini = SecureChannel(
        local_id=1, static_key=keys[1], roster_keys=roster, run_id=RUN, initiator=True, peer_id=0
    )
    res = SecureChannel(
        local_id=1, static_key=keys[1], roster_keys=roster, run_id=RUN, initiator=False
    )
    ini.start()
    data = bytearray(ini.data_to_send())
    data[12:16] = (1).to_bytes(4, "big")  # redirect the dial to node 1 itself
    with pytest.raises(PeerRejected, match="claims to be this node"):
        res.receive_data(bytes(data))


def test_different_run_id(keys, roster):
    ini, res = make_pair(keys, roster, run_b=b"another-run")
    ini.start()
    with pytest.raises(PeerRejected, match="different run"):
        res.receive_data(ini.data_to_send())


def test_run_id_is_bound_into_the_keys_even_with_a_forged_run_tag(keys, roster):
    """Patching the cleartext run tag does not help: the run id is in the transcript hash."""
    ini, res = make_pair(keys, roster, run_b=b"another-run")
    ini.start()
    m1 = bytearray(ini.data_to_send())
    m1[16:32] = run_tag(b"another-run")
    res.receive_data(bytes(m1))
    with pytest.raises(AuthenticationError):
        ini.receive_data(res.data_to_send())


def test_tampered_m1_ephemeral_breaks_the_handshake(keys, roster):
    ini, res = make_pair(keys, roster)
    ini.start()
    m1 = bytearray(ini.data_to_send())
    m1[-1] ^= 0x01
    res.receive_data(bytes(m1))
    with pytest.raises(AuthenticationError):
        ini.receive_data(res.data_to_send())


def test_tampered_m2_tag(keys, roster):
    ini, res = make_pair(keys, roster)
    ini.start()
    res.receive_data(ini.data_to_send())
    m2 = bytearray(res.data_to_send())
    m2[40] ^= 0x80
    with pytest.raises(AuthenticationError):
        ini.receive_data(bytes(m2))


def test_tampered_m4(keys, roster):
    ini, res = make_pair(keys, roster)
    ini.start()
    res.receive_data(ini.data_to_send())
    ini.receive_data(res.data_to_send())
    res.receive_data(ini.data_to_send())
    m4 = bytearray(res.data_to_send())
    m4[0] ^= 1
    with pytest.raises(AuthenticationError, match="confirmation"):
        ini.receive_data(bytes(m4))
    assert not ini.established


def test_low_order_ephemeral_is_a_clean_error(keys, roster):
    ini, res = make_pair(keys, roster)
    ini.start()
    m1 = bytearray(ini.data_to_send())
    m1[32:64] = bytes(32)  # the all-zero point
    with pytest.raises(HandshakeError, match="low-order"):
        res.receive_data(bytes(m1))


def test_constructor_checks(keys, roster):
    with pytest.raises(ValueError, match="does not match the roster key of node 0"):
        SecureChannel(
            local_id=0, static_key=keys[1], roster_keys=roster, run_id=RUN, initiator=False
        )
    with pytest.raises(ValueError, match="not in the roster"):
        SecureChannel(
            local_id=7, static_key=keys[1], roster_keys=roster, run_id=RUN, initiator=False
        )
    with pytest.raises(ValueError, match="peer_id"):
        SecureChannel(
            local_id=0, static_key=keys[0], roster_keys=roster, run_id=RUN, initiator=True
        )
    with pytest.raises(ValueError, match="itself"):
        SecureChannel(
            local_id=0,
            static_key=keys[0],
            roster_keys=roster,
            run_id=RUN,
            initiator=True,
            peer_id=0,
        )
    with pytest.raises(ValueError, match="run_id"):
        SecureChannel(
            local_id=0, static_key=keys[0], roster_keys=roster, run_id=b"", initiator=False
        )
    with pytest.raises(ValueError, match="max_frame"):
        SecureChannel(
            local_id=0,
            static_key=keys[0],
            roster_keys=roster,
            run_id=RUN,
            initiator=False,
            max_frame=8,
        )
    with pytest.raises(ValueError, match="32 raw bytes"):
        SecureChannel(
            local_id=0,
            static_key=keys[0],
            roster_keys={**roster, 3: b"short"},
            run_id=RUN,
            initiator=False,
        )
    with pytest.raises(ValueError, match="local_id"):
        SecureChannel(
            local_id=True, static_key=keys[0], roster_keys=roster, run_id=RUN, initiator=False
        )


# --------------------------------------------------------------------------- garbage


def test_garbage_handshake_fails_at_first_byte(keys, roster):
    _, res = make_pair(keys, roster)
    with pytest.raises(HandshakeError, match="not a coordinator-free channel"):
        res.receive_data(b"G")
    assert_dead(res)


def test_wrong_version(keys, roster):
    ini, res = make_pair(keys, roster)
    ini.start()
    m1 = bytearray(ini.data_to_send())
    m1[5] = 1  # the version before cipher negotiation
    with pytest.raises(PeerRejected, match="version 1; this node speaks 2"):
        res.receive_data(bytes(m1))


def _pair_with(keys, roster, offer, accept):
    ini = SecureChannel(local_id=0, static_key=keys[0], roster_keys=roster, run_id=RUN,
                        initiator=True, peer_id=1, ciphers=offer)  # fmt: skip
    res = SecureChannel(local_id=1, static_key=keys[1], roster_keys=roster, run_id=RUN,
                        initiator=False, ciphers=accept)  # fmt: skip
    return ini, res


@pytest.mark.parametrize(
    "offer, accept, chosen",
    [
        ((AES_256_GCM, CHACHA20_POLY1305), (AES_256_GCM, CHACHA20_POLY1305), "aes-256-gcm"),
        # The responder's order decides among what both have.
        ((AES_256_GCM, CHACHA20_POLY1305), (CHACHA20_POLY1305, AES_256_GCM), "chacha20-poly1305"),
        ((CHACHA20_POLY1305,), (AES_256_GCM, CHACHA20_POLY1305), "chacha20-poly1305"),
        ((AES_256_GCM,), (AES_256_GCM,), "aes-256-gcm"),
    ],
)
def test_the_frame_cipher_is_negotiated(keys, roster, offer, accept, chosen):
    ini, res = _pair_with(keys, roster, offer, accept)
    pump(ini, res)
    assert ini.established and res.established
    assert ini.cipher == res.cipher == chosen
    ini.send(b"both ways")
    assert res.receive_data(ini.data_to_send()) == [MessageReceived(b"both ways")]
    res.send(b"back")
    assert ini.receive_data(res.data_to_send()) == [MessageReceived(b"back")]


def test_no_common_cipher_is_refused_by_name(keys, roster):
    ini, res = _pair_with(keys, roster, (CHACHA20_POLY1305,), (AES_256_GCM,))
    ini.start()
    with pytest.raises(PeerRejected, match="offers chacha20-poly1305; this node accepts aes-256"):
        res.receive_data(ini.data_to_send())


def test_a_downgraded_offer_fails_authentication(keys, roster):
    """Someone on the path strips AES from the offer: the responder answers the offer it saw,
    but M1 is in the transcript, so the initiator's check of tag2 fails."""
    both = (AES_256_GCM, CHACHA20_POLY1305)
    ini, res = _pair_with(keys, roster, both, both)
    ini.start()
    m1 = bytearray(ini.data_to_send())
    m1[7] = CHACHA20_POLY1305
    res.receive_data(bytes(m1))
    with pytest.raises(AuthenticationError):
        ini.receive_data(res.data_to_send())


def test_cipher_settings():
    assert cipher_suites("chacha20-poly1305") == (CHACHA20_POLY1305,)
    assert cipher_suites("aes-256-gcm") == (AES_256_GCM,)
    auto = cipher_suites("auto")
    assert auto[-1] == CHACHA20_POLY1305
    assert (AES_256_GCM in auto) == cpu_has_aes()
    with pytest.raises(ValueError, match="expected one of auto"):
        cipher_suites("rot13")


def test_data_before_start_and_send_before_handshake(keys, roster):
    ini, res = make_pair(keys, roster)
    with pytest.raises(HandshakeError, match="before the handshake started"):
        ini.receive_data(b"\x00" * 48)
    with pytest.raises(ChannelClosed, match="before the handshake"):
        res.send(b"x")


def test_fuzz_garbage_only_channel_errors(keys, roster):
    rnd = random.Random(7)
    ini0, res0 = make_pair(keys, roster)
    ini0.start()
    m1 = ini0.data_to_send()
    for i in range(600):
        ini, res = make_pair(keys, roster)
        if i % 3 == 0:  # pure garbage at a responder
            data = rnd.randbytes(rnd.randrange(1, 200))
            target = res
        elif i % 3 == 1:  # mutated M1
            data = bytearray(m1)
            data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
            data = bytes(data) + rnd.randbytes(rnd.randrange(0, 80))
            target = res
        else:  # garbage answer to an initiator
            ini.start()
            ini.data_to_send()
            data = rnd.randbytes(rnd.randrange(1, 120))
            target = ini
        try:
            target.receive_data(data)
        except ChannelError:
            assert target.closed
        else:
            assert not target.established


def test_eof_during_handshake(keys, roster):
    ini, res = make_pair(keys, roster)
    ini.start()
    res.receive_data(ini.data_to_send()[:10])
    with pytest.raises(HandshakeError, match="closed during the handshake"):
        res.receive_eof()


# --------------------------------------------------------------------------- frame integrity


def test_tampered_ciphertext_byte(keys, roster):
    ini, res = established_pair(keys, roster)
    good, bad = frames(ini, b"first", b"second message")
    bad = bytearray(bad)
    bad[HEADER_SIZE + 3] ^= 0x04
    with pytest.raises(FrameError, match="frame 1 .*failed authentication") as err:
        res.receive_data(good + bytes(bad))
    assert err.value.events == (MessageReceived(b"first"),)  # authentic data before it survives
    assert_dead(res)


def test_tampered_tag_byte(keys, roster):
    ini, res = established_pair(keys, roster)
    (f,) = frames(ini, b"payload")
    f = bytearray(f)
    f[-1] ^= 0xFF
    with pytest.raises(FrameError, match="failed authentication"):
        res.receive_data(bytes(f))


def test_tampered_header_type(keys, roster):
    ini, res = established_pair(keys, roster)
    (f,) = frames(ini, b"payload")
    f = bytearray(f)
    f[4] = 1  # data -> control: the AAD covers the header
    with pytest.raises(FrameError, match="failed authentication"):
        res.receive_data(bytes(f))


def test_tampered_header_length(keys, roster):
    ini, res = established_pair(keys, roster)
    f1, f2 = frames(ini, b"payload", b"next")
    f1 = bytearray(f1)
    f1[3] -= 2  # shorter: the body boundary moves and the tag no longer matches
    with pytest.raises(FrameError, match="failed authentication"):
        res.receive_data(bytes(f1) + f2)


def test_tampered_header_sequence(keys, roster):
    ini, res = established_pair(keys, roster)
    (f,) = frames(ini, b"payload")
    f = bytearray(f)
    f[12] ^= 0x01  # seq 0 -> 1
    with pytest.raises(FrameError, match="sequence number 1, expected 0"):
        res.receive_data(bytes(f))


def test_replayed_frame(keys, roster):
    ini, res = established_pair(keys, roster)
    f0, f1 = frames(ini, b"a", b"b")
    assert res.receive_data(f0 + f1) == [MessageReceived(b"a"), MessageReceived(b"b")]
    with pytest.raises(FrameError, match="sequence number 0, expected 2: replayed"):
        res.receive_data(f0)
    assert_dead(res)


def test_reordered_frames(keys, roster):
    ini, res = established_pair(keys, roster)
    f0, f1, f2 = frames(ini, b"a", b"b", b"c")
    assert res.receive_data(f0) == [MessageReceived(b"a")]
    with pytest.raises(
        FrameError, match="sequence number 2, expected 1: frames missing or reordered"
    ):
        res.receive_data(f2 + f1)


def test_frame_from_the_other_direction_is_rejected(keys, roster):
    """A frame reflected back to its sender fails: each direction has its own key."""
    ini, res = established_pair(keys, roster)
    (f,) = frames(ini, b"reflected")
    with pytest.raises(FrameError, match="failed authentication"):
        ini.receive_data(f)


def test_frame_under_another_connections_key(keys, roster):
    ini1, _ = established_pair(keys, roster)
    _, res2 = established_pair(keys, roster)
    (f,) = frames(ini1, b"spliced")
    with pytest.raises(FrameError, match="another key"):
        res2.receive_data(f)


def test_truncated_frame_then_eof(keys, roster):
    ini, res = established_pair(keys, roster)
    (f,) = frames(ini, b"z" * 100)
    assert res.receive_data(f[:-5]) == []
    with pytest.raises(
        FrameError, match=r"closed in the middle of frame 0 \(124 bytes received of 129"
    ):
        res.receive_eof()
    assert_dead(res)


def test_truncated_header_then_eof(keys, roster):
    ini, res = established_pair(keys, roster)
    (f,) = frames(ini, b"z")
    res.receive_data(f[:5])
    with pytest.raises(FrameError, match="13-byte header"):
        res.receive_eof()


def test_truncated_frame_followed_by_more_data(keys, roster):
    ini, res = established_pair(keys, roster)
    f0, f1 = frames(ini, b"x" * 40, b"y" * 40)
    with pytest.raises(FrameError):
        res.receive_data(f0[:-3] + f1)


def test_clean_eof(keys, roster):
    ini, res = established_pair(keys, roster)
    res.receive_eof()
    assert res.closed and res.error is None


def test_oversize_length_prefix_refused_before_body(keys, roster):
    ini, res = established_pair(keys, roster, max_frame=1024)
    header = struct.pack(">IBQ", 1025, 0, 0)
    with pytest.raises(FrameTooLarge, match="1025 bytes, over max_frame 1024"):
        res.receive_data(header)  # only the header: no body was needed to refuse it
    assert_dead(res)


def test_huge_length_prefix_with_default_limit(keys, roster):
    ini, res = established_pair(keys, roster)
    with pytest.raises(FrameTooLarge):
        res.receive_data(b"\xff\xff\xff\xff" + bytes(9))


def test_undersize_length_prefix(keys, roster):
    ini, res = established_pair(keys, roster)
    with pytest.raises(FrameError, match="shorter than the 16-byte"):
        res.receive_data(struct.pack(">IBQ", 15, 0, 0))


def test_send_respects_max_frame(keys, roster):
    ini, res = established_pair(keys, roster, max_frame=1024)
    ini.send(b"x" * (1024 - TAG_SIZE))
    assert res.receive_data(ini.data_to_send()) == [MessageReceived(b"x" * 1008)]
    with pytest.raises(ValueError, match="does not fit a frame"):
        ini.send(b"x" * (1024 - TAG_SIZE + 1))
    assert ini.established  # a refused send does not kill the channel


def test_unknown_frame_type_from_authentic_peer(keys, roster):
    ini, res = established_pair(keys, roster)
    ini._send_frame(7, b"?")  # a peer speaking a later frame type
    with pytest.raises(FrameError, match="unknown type 7"):
        res.receive_data(ini.data_to_send())


def test_counter_exhaustion(keys, roster):
    ini, res = established_pair(keys, roster)
    ini._send_seq = MAX_SEQ  # as if 2**64 - 1 frames had been sent
    res._recv_seq = MAX_SEQ
    ini.send(b"last")
    assert res.receive_data(ini.data_to_send()) == [MessageReceived(b"last")]
    with pytest.raises(CounterExhausted, match="exhausted"):
        ini.send(b"one too many")
    assert ini.data_to_send() == b""
    # A forged frame claiming to come after the limit is refused by the receiver.
    with pytest.raises(FrameError, match="past the 64-bit counter limit"):
        res.receive_data(struct.pack(">IBQ", 16, 0, MAX_SEQ) + bytes(16))


def test_close_is_final(keys, roster):
    ini, res = established_pair(keys, roster)
    ini.close()
    assert_dead(ini)
    with pytest.raises(ChannelClosed, match="closed locally"):
        ini.send(b"x")


# --------------------------------------------------------------------------- dup-dial rule


def test_edge_leader():
    assert edge_leader(3, 7) == edge_leader(7, 3) == 3
    with pytest.raises(ValueError):
        edge_leader(2, 2)


def test_dup_dial_action_table():
    assert dup_dial_action(1, 5, edge_has_connection=False) is DupAction.SELECT
    assert dup_dial_action(1, 5, edge_has_connection=True) is DupAction.DROP
    assert dup_dial_action(5, 1, edge_has_connection=False) is DupAction.AWAIT_SELECT
    assert dup_dial_action(5, 1, edge_has_connection=True) is DupAction.AWAIT_SELECT


def _simulate_edge(order: list[tuple[str, str]], low: int = 2, high: int = 9) -> tuple:
    """Model both ends of one edge under a given interleaving of per-node events.

    Connections "x" (dialled by low) and "y" (dialled by high) both complete their handshakes.
    Events: ("low"/"high", "est:<c>") handshake complete at that end; the leader's select frame
    for connection c reaches the follower as ("high", "sel:<c>") and can only be delivered after
    the leader selected c. Returns (leader's connection, follower's connection, closed set).
    """
    leader_sel: str | None = None
    follower_sel: str | None = None
    closed: set[str] = set()
    sent_select: set[str] = set()
    for node, ev in order:
        kind, conn = ev.split(":")
        if conn in closed:
            continue
        local, peer = (low, high) if node == "low" else (high, low)
        if kind == "est":
            have = leader_sel is not None if node == "low" else follower_sel is not None
            action = dup_dial_action(local, peer, edge_has_connection=have)
            if action is DupAction.SELECT:
                leader_sel = conn
                sent_select.add(conn)
            elif action is DupAction.DROP:
                closed.add(conn)
        elif kind == "sel":
            assert conn in sent_select
            follower_sel = conn
    return leader_sel, follower_sel, closed


def test_dup_dial_all_interleavings_agree():
    events = [("low", "est:x"), ("low", "est:y"), ("high", "est:x"), ("high", "est:y")]
    outcomes = set()
    for perm in itertools.permutations(events):
        # the select frame of whichever connection the leader picks arrives at some later point
        leader_first = next(ev for node, ev in perm if node == "low").split(":")[1]
        idx = next(i for i, (node, ev) in enumerate(perm) if node == "low")
        follower_est_idx = next(
            i for i, (node, ev) in enumerate(perm) if node == "high" and ev == f"est:{leader_first}"
        )
        for pos in range(max(idx, follower_est_idx) + 1, len(perm) + 1):
            order = list(perm[:pos]) + [("high", f"sel:{leader_first}")] + list(perm[pos:])
            lead, follow, closed = _simulate_edge(order)
            assert lead == follow == leader_first
            assert closed == {"x", "y"} - {lead}
            outcomes.add(lead)
    assert outcomes == {"x", "y"}  # either connection can win; the ends always agree


@pytest.mark.parametrize(
    "suites", [(AES_256_GCM,), (CHACHA20_POLY1305,)], ids=["aes-256-gcm", "chacha20-poly1305"]
)
def test_pieces_make_the_frame_of_their_join(keys, roster, suites):
    """send_parts of pieces (a large payload: AES-256-GCM encrypts them one by one) delivers
    the same bytes as send of their join, in a frame of the same size."""
    import numpy as np

    from coordinator_free.net.channel import STREAM_MIN, MessageReceived

    def pair():
        ini, res = _pair_with(keys, roster, suites, suites)
        pump(ini, res)
        return ini, res

    rng = np.random.default_rng(3)
    big = rng.standard_normal(STREAM_MIN // 8 + 5)
    for pieces in (
        [b"head", memoryview(big).cast("B")],
        [b"a", b"bc", b"d"],  # small: joined
        [memoryview(big).cast("B")],
        [b"", b"x" * STREAM_MIN, b"tail"],
    ):
        joined = b"".join(pieces)
        a_ini, a_res = pair()
        b_ini, b_res = pair()
        a_ini.send_parts(pieces)
        b_ini.send(joined)
        wire_a = a_ini.data_to_send()
        assert len(wire_a) == len(joined) + 13 + 16
        assert a_res.receive_data(wire_a) == [MessageReceived(joined)]
        # The same plaintext under the other pair's keys: check the frame's own layout.
        assert b_res.receive_data(b_ini.data_to_send()) == [MessageReceived(joined)]


def test_pieces_encrypted_one_by_one_are_the_aead_of_their_join():
    import os

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from coordinator_free.net.channel import _seal_pieces

    key, nonce, aad = os.urandom(32), os.urandom(12), os.urandom(13)
    for sizes in ([5, 70000], [1, 1, 200000], [100000], [0, 65536, 3]):
        pieces = [os.urandom(n) for n in sizes]
        pieces[-1] = memoryview(pieces[-1])
        got = bytes(_seal_pieces(key, nonce, aad, pieces, sum(sizes)))
        assert got == AESGCM(key).encrypt(nonce, b"".join(pieces), aad)
