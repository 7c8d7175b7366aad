"""Sans-IO secure channel: mutual authentication against a pinned roster, AEAD frames.

No sockets and no event loop here: a :class:`SecureChannel` is fed the bytes that arrived
(:meth:`SecureChannel.receive_data`), returns events, and queues the bytes to send
(:meth:`SecureChannel.data_to_send`). The design, message layouts, key schedule and the reason
for every check are in ``docs/security.md``; in short:

* handshake (4 messages, fixed sizes)::

      M1  I -> R   preamble(8) | initiator id u32 | responder id u32 | run tag(16) | e_i(32)
                   (the preamble carries the AEADs the initiator offers for its frames)
      M2  R -> I   e_r(32) | chosen AEAD u16 | tag2(16)   proves R holds s_r  (ee, es)
      M3  I -> R   tag3(16)               proves I holds s_i      (ee, es, se)
      M4  R -> I   tag4(16)               R accepted I; keys confirmed

  Every tag is a ChaCha20-Poly1305 tag over the empty plaintext with the running transcript hash
  as associated data, under a key HKDF-SHA256 derives from the DH results so far, salted with
  that transcript hash (which starts from the protocol name and the run id).

* frames::

      length u32 BE | type u8 | seq u64 BE | ciphertext(length bytes, 16-byte tag included)

  nonce = 4 zero bytes | seq (64-bit BE), one key per direction, AAD = the 13-byte header,
  under the AEAD the responder chose from the initiator's offer: AES-256-GCM where both ends
  have AES instructions, ChaCha20-Poly1305 otherwise (``ciphers``). The
  explicit ``seq`` must equal the receiver's counter, so replays and reordering are named as such
  before decryption; the AEAD tag then covers the header.

Any failure raises a :class:`ChannelError` subclass and leaves the channel dead; later calls raise
:class:`ChannelClosed` quoting the original cause.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "AuthenticationError",
    "ChannelClosed",
    "ChannelError",
    "ControlReceived",
    "CounterExhausted",
    "DEFAULT_MAX_FRAME",
    "DupAction",
    "Event",
    "FrameError",
    "FrameTooLarge",
    "HEADER_SIZE",
    "HandshakeComplete",
    "HandshakeCut",
    "HandshakeError",
    "M1_SIZE",
    "MAX_NODE_ID",
    "MAX_SEQ",
    "MessageReceived",
    "PeerRejected",
    "SecureChannel",
    "TAG_SIZE",
    "dup_dial_action",
    "edge_leader",
    "run_tag",
]

PROTOCOL_NAME = (
    b"coordinator-free channel v2: X25519, HKDF-SHA256, ChaCha20-Poly1305 or AES-256-GCM"
)
MAGIC = b"CFCH"
VERSION = 2

#: The frame AEADs, as bits of the offer in M1 and as the choice in M2.
CHACHA20_POLY1305 = 1
AES_256_GCM = 2
CIPHER_NAMES = {CHACHA20_POLY1305: "chacha20-poly1305", AES_256_GCM: "aes-256-gcm"}
_AEADS = {CHACHA20_POLY1305: ChaCha20Poly1305, AES_256_GCM: AESGCM}
#: ``ciphers`` settings: what a node offers (initiator) and accepts (responder), best first.
CIPHER_CHOICES = ("auto", "aes-256-gcm", "chacha20-poly1305")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (``/proc/cpuinfo``'s x86 ``flags`` or Arm ``Features``); empty
    where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_has_aes() -> bool:
    """Whether this CPU has AES instructions (x86 ``aes`` flag, Arm ``aes`` feature): there
    AES-256-GCM runs several times faster than ChaCha20-Poly1305; without them, far slower."""
    return "aes" in cpu_flags()


def cipher_suites(setting: str) -> tuple[int, ...]:
    """The AEADs a node uses for its frames, best first: ``auto`` is AES-256-GCM then
    ChaCha20-Poly1305 on a CPU with AES instructions, ChaCha20-Poly1305 alone otherwise; a named
    cipher is that one alone."""
    if setting == "auto":
        return (AES_256_GCM, CHACHA20_POLY1305) if cpu_has_aes() else (CHACHA20_POLY1305,)
    for suite, name in CIPHER_NAMES.items():
        if setting == name:
            return (suite,)
    raise ValueError(f"cipher {setting!r}: expected one of {', '.join(CIPHER_CHOICES)}")


def _preamble(offer: int) -> bytes:
    return MAGIC + VERSION.to_bytes(2, "big") + offer.to_bytes(2, "big")


PREAMBLE = _preamble(0)  # the layout; the last two bytes are the initiator's offer
RUN_TAG_LABEL = b"coordinator-free run tag v1"

KEY_SIZE = 32
TAG_SIZE = 16
RUN_TAG_SIZE = 16
MAX_NODE_ID = (1 << 32) - 1
MAX_SEQ = (1 << 64) - 1
DEFAULT_MAX_FRAME = 64 << 20
#: A channel's own receive buffer (:meth:`SecureChannel.own_buffer`): its first size, and the
#: least room it offers a read. It grows with the bytes that arrive (to at most twice those
#: held) up to the frame in progress (at most ``max_frame`` and a header, checked there).
RECV_INITIAL = 8 << 10
RECV_ROOM = 4 << 10
#: An emptied receive buffer larger than this is given back (a stream of frames up to this
#: size keeps its buffer from one to the next).
RECV_KEEP = 4 << 20

_IDS = struct.Struct(">II")
_HEADER = struct.Struct(">IBQ")
HEADER_SIZE = _HEADER.size  # 13
M1_SIZE = len(PREAMBLE) + _IDS.size + RUN_TAG_SIZE + KEY_SIZE  # 64
_SUITE = struct.Struct(">H")
M2_SIZE = KEY_SIZE + _SUITE.size + TAG_SIZE  # 50
M3_SIZE = TAG_SIZE
M4_SIZE = TAG_SIZE

FRAME_DATA = 0
FRAME_CONTROL = 1
_ZERO_NONCE = bytes(12)


# --------------------------------------------------------------------------- errors and events


class ChannelError(Exception):
    """The channel failed and is dead.

    ``events`` holds the events decoded from the same :meth:`SecureChannel.receive_data` call
    before the failure (authentic data that preceded the bad bytes), so a driver can still
    deliver them.
    """

    events: tuple[Event, ...] = ()


class HandshakeError(ChannelError):
    """The handshake could not complete (malformed bytes, early close, invalid key)."""


class HandshakeCut(HandshakeError):
    """The other side closed before the handshake completed: a port scan, a health probe, a
    peer that gave up. Nothing was accepted from it."""


class PeerRejected(HandshakeError):
    """The initiator is not acceptable: unknown id, not allowed, wrong target, other run, version."""


class AuthenticationError(HandshakeError):
    """The other side did not prove possession of the static key the roster pins for it."""


class FrameError(ChannelError):
    """A frame after the handshake was tampered with, replayed, reordered or truncated."""


class FrameTooLarge(FrameError):
    """A frame's length prefix exceeds ``max_frame``; refused before reading the body."""


class CounterExhausted(ChannelError):
    """The 64-bit send counter is used up; sending more would reuse a nonce."""


class ChannelClosed(ChannelError):
    """The channel was already dead or closed when it was used."""


@dataclass(frozen=True)
class HandshakeComplete:
    """Both sides are authenticated; ``peer_id`` is the roster id of the other side."""

    peer_id: int


@dataclass(frozen=True)
class MessageReceived:
    """One authentic data frame's plaintext."""

    payload: bytes


@dataclass(frozen=True)
class ControlReceived:
    """One authentic control frame's plaintext (used by the transport for connection choice)."""

    payload: bytes


Event = HandshakeComplete | MessageReceived | ControlReceived


# --------------------------------------------------------------------------- dup-dial rule


def edge_leader(a: int, b: int) -> int:
    """The node that decides which connection carries the edge ``{a, b}``: the lower id."""
    if a == b:
        raise ValueError(f"an edge needs two distinct nodes, got {a} twice")
    return min(a, b)


class DupAction(Enum):
    """What to do with a connection that has just completed its handshake."""

    SELECT = "select"  # leader: use it and announce it with a select control frame
    DROP = "drop"  # leader: the edge already has a connection; close this one
    AWAIT_SELECT = "await_select"  # follower: use it only once the leader selects it


def dup_dial_action(local_id: int, peer_id: int, *, edge_has_connection: bool) -> DupAction:
    """The duplicate-dial rule, as a pure function.

    Both ends may dial each other at once, so an edge can briefly have two authenticated
    connections. The edge's leader (:func:`edge_leader`) keeps the first connection that
    completes its handshake at its end, whichever side dialled it, announces the choice in a
    control frame on that connection, and closes any other. The follower never sends on a
    connection the leader has not selected, and adopts a connection when the select frame
    arrives. Exactly one connection survives and both ends agree on it, and since the follower
    waits for the select frame, no message is ever sent on a connection that is about to be
    closed as a duplicate.
    """
    if edge_leader(local_id, peer_id) == local_id:
        return DupAction.DROP if edge_has_connection else DupAction.SELECT
    return DupAction.AWAIT_SELECT


# --------------------------------------------------------------------------- helpers


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int = KEY_SIZE) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


#: Data frames of at least this many bytes given in pieces (:meth:`SecureChannel.send_parts`)
#: are encrypted piece by piece under AES-256-GCM.
STREAM_MIN = 64 << 10


def _seal_pieces(key: bytes, nonce: bytes, aad: bytes, pieces: list, total: int) -> memoryview:
    """AES-256-GCM of the pieces' concatenation (``total`` bytes), tag appended: the bytes
    ``AESGCM(key).encrypt(nonce, b"".join(pieces), aad)`` returns, without the join."""
    enc = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    enc.authenticate_additional_data(aad)
    out = np.empty(total + TAG_SIZE, dtype=np.uint8)  # every byte is written below
    view = memoryview(out)
    pos = 0
    for piece in pieces:
        pos += enc.update_into(piece, view[pos:])
    enc.finalize()
    view[pos:] = enc.tag
    return view


_NONCE = struct.Struct(">4xQ")  # 4 zero bytes, then the 64-bit counter
_nonce = _NONCE.pack


def _offer_names(offer: int) -> str:
    names = [name for c, name in CIPHER_NAMES.items() if offer & c]
    return ", ".join(names) if names else "no cipher"


def run_tag(run_id: bytes) -> bytes:
    """The 16-byte run digest sent in M1, so peers of different runs refuse each other clearly."""
    return hashlib.sha256(RUN_TAG_LABEL + run_id).digest()[:RUN_TAG_SIZE]


def _check_id(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_NODE_ID:
        raise ValueError(f"{name} must be an integer in 0..{MAX_NODE_ID}, got {value!r}")
    return value


class RosterKeys(Mapping[int, bytes]):
    """A roster's public keys (node id -> 32 raw bytes), checked once. A channel checks every
    entry of the roster it is given, unless it is given a RosterKeys: a PeerNet makes a channel
    for every connection it dials or accepts, and at 1024 nodes checking the whole roster again
    cost 0.6 ms a channel (0.01 ms given a RosterKeys), some 20 channels per peer at start."""

    __slots__ = ("_keys",)

    def __init__(self, roster_keys: Mapping[int, bytes]) -> None:
        keys: dict[int, bytes] = {}
        for nid, pub in roster_keys.items():
            _check_id("roster node id", nid)
            if not isinstance(pub, bytes | bytearray) or len(pub) != KEY_SIZE:
                raise ValueError(f"roster key of node {nid} must be {KEY_SIZE} raw bytes")
            keys[nid] = bytes(pub)
        self._keys = keys

    def __getitem__(self, nid: int) -> bytes:
        return self._keys[nid]

    def __contains__(self, nid: object) -> bool:
        return nid in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class _State(Enum):
    START = "start"  # initiator before start()
    WAIT_M1 = "wait_m1"  # responder
    WAIT_M2 = "wait_m2"  # initiator
    WAIT_M3 = "wait_m3"  # responder
    WAIT_M4 = "wait_m4"  # initiator
    ESTABLISHED = "established"
    CLOSED = "closed"


# --------------------------------------------------------------------------- the channel


class SecureChannel:
    """One end of an authenticated, encrypted connection between two roster nodes.

    ``roster_keys`` maps node id -> 32-byte raw X25519 public key and must contain this node
    with the public half of ``static_key``. An initiator names the node it dials in
    ``peer_id`` (which must be in the roster); a responder accepts initiators in the roster and,
    if ``allowed_peers`` is given, in that set. ``run_id`` must be identical on both sides.

    Usage: the initiator calls :meth:`start`; both sides move :meth:`data_to_send` to the
    socket and feed arrived bytes to :meth:`receive_data` (any split or coalescing is fine),
    which returns :class:`HandshakeComplete` once, then :class:`MessageReceived` /
    :class:`ControlReceived` in order. :meth:`bytes_needed` says how many more bytes the next
    step needs, which suits ``readexactly`` drivers; :meth:`receive_eof` reports a close.
    """

    def __init__(
        self,
        *,
        local_id: int,
        static_key: X25519PrivateKey,
        roster_keys: Mapping[int, bytes],
        run_id: bytes,
        initiator: bool,
        peer_id: int | None = None,
        allowed_peers: Collection[int] | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        ciphers: Collection[int] | None = None,
    ) -> None:
        self._local_id = _check_id("local_id", local_id)
        if not isinstance(static_key, X25519PrivateKey):
            raise TypeError(
                f"static_key must be an X25519PrivateKey, got {type(static_key).__name__}"
            )
        if not isinstance(run_id, bytes | bytearray) or not run_id:
            raise ValueError("run_id must be non-empty bytes")
        if not isinstance(max_frame, int) or isinstance(max_frame, bool) or max_frame <= TAG_SIZE:
            raise ValueError(f"max_frame must be an integer > {TAG_SIZE}, got {max_frame!r}")
        if max_frame > 0xFFFFFFFF:
            raise ValueError(f"max_frame {max_frame} does not fit the 32-bit length prefix")
        keys = roster_keys if isinstance(roster_keys, RosterKeys) else RosterKeys(roster_keys)
        self._static = static_key
        self._static_pub = _raw_public(static_key)
        if keys.get(local_id) != self._static_pub:
            raise ValueError(
                f"static_key does not match the roster key of node {local_id}"
                if local_id in keys
                else f"node {local_id} is not in the roster"
            )
        self._roster = keys
        self._run_id = bytes(run_id)
        self._initiator = bool(initiator)
        self._allowed = None if allowed_peers is None else frozenset(allowed_peers)
        # Frame AEADs this end offers (initiator) or accepts (responder), best first.
        suites = tuple(cipher_suites("auto") if ciphers is None else ciphers)
        if not suites or any(c not in _AEADS for c in suites):
            raise ValueError(f"ciphers must name AEADs among {sorted(_AEADS)}, got {suites!r}")
        self._suites = suites
        self.cipher: str | None = None  # the frames' AEAD, once the handshake chose it
        self._max_frame = max_frame
        if self._initiator:
            if peer_id is None:
                raise ValueError("an initiator must name the node it dials (peer_id)")
            _check_id("peer_id", peer_id)
            if peer_id == local_id:
                raise ValueError(f"node {local_id} cannot dial itself")
            if peer_id not in keys:
                raise ValueError(f"node {peer_id} is not in the roster")
            if self._allowed is not None and peer_id not in self._allowed:
                raise ValueError(f"node {peer_id} is not among the allowed peers")
            self._state = _State.START
        else:
            if peer_id is not None:
                raise ValueError("a responder learns peer_id from the handshake; pass None")
            self._state = _State.WAIT_M1
        self._peer_id: int | None = peer_id

        self._buf = bytearray()
        self._off = 0  # frames before this offset of _buf are consumed (cut once per call)
        # Own receive buffer (own_buffer): _buf is preallocated, its bytes _off.._end are held.
        self._own = False
        self._end = 0
        self._out: list[bytes] = []
        self._h = hashlib.sha256(PROTOCOL_NAME).digest()
        self._mix(len(self._run_id).to_bytes(4, "big") + self._run_id)
        self._ephemeral: X25519PrivateKey | None = None
        self._peer_ephemeral: X25519PublicKey | None = None
        self._dh = b""  # concatenated DH results so far (ee | es | se)
        self._pending_len: int | None = None
        self._pending_type = 0
        self._send_aead: ChaCha20Poly1305 | AESGCM | None = None
        self._send_key: bytes | None = None  # AES-256-GCM only (send_parts)
        self._recv_aead: ChaCha20Poly1305 | AESGCM | None = None
        self._suite = 0
        self._send_seq = 0
        self._recv_seq = 0
        self.error: ChannelError | None = None
        self._close_reason = ""

    # ----------------------------------------------------------------- properties

    @property
    def local_id(self) -> int:
        return self._local_id

    @property
    def initiator(self) -> bool:
        return self._initiator

    @property
    def peer_id(self) -> int | None:
        """The other node: for an initiator the node it dials; for a responder the id claimed in
        the first message (None before it). Authenticated only once :attr:`established`."""
        return self._peer_id

    @property
    def established(self) -> bool:
        return self._state is _State.ESTABLISHED

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    @property
    def mid_frame(self) -> bool:
        """True while part of a frame (or handshake message) has arrived but not all of it."""
        return self._held() > 0

    def _held(self) -> int:
        """How many bytes have arrived and not been consumed."""
        return self._end - self._off if self._own else len(self._buf)

    @property
    def frames_sent(self) -> int:
        return self._send_seq

    @property
    def frames_received(self) -> int:
        return self._recv_seq

    # ----------------------------------------------------------------- public API

    def start(self) -> None:
        """Initiator: queue M1. A responder has nothing to start; calling it there is a no-op."""
        if not self._initiator:
            return
        if self._state is not _State.START:
            raise ChannelClosed("start() may be called once, before any data")
        assert self._peer_id is not None
        self._ephemeral = X25519PrivateKey.generate()
        offer = 0
        for c in self._suites:
            offer |= c
        m1 = (
            _preamble(offer)
            + _IDS.pack(self._local_id, self._peer_id)
            + run_tag(self._run_id)
            + _raw_public(self._ephemeral)
        )
        self._mix(m1)
        self._mix(self._roster[self._peer_id])
        self._out.append(m1)
        self._state = _State.WAIT_M2

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Consume arrived bytes; return the events they complete, in order.

        Raises a :class:`ChannelError` subclass on any defect; the channel is then dead.
        """
        if self._state is _State.CLOSED:
            raise ChannelClosed(f"channel is closed ({self._close_reason})")
        if self._state is _State.START:
            self._fail(HandshakeError("received data before the handshake started"), [])
        if self._own:
            raise ValueError("a channel with its own buffer takes bytes through receive_into")
        self._buf += data
        return self._process()

    def share_buffer(self, buf: bytearray) -> None:
        """From now on, read frames from ``buf``: a buffer the caller appends the arrived bytes
        to itself (a stream's receive buffer), instead of handing them to
        :meth:`receive_data`, which would copy them here. :meth:`receive_buffered` then
        decrypts the complete frames where they lie and cuts them from the front of ``buf``.
        Only for an established channel that holds no bytes of its own."""
        if self._state is not _State.ESTABLISHED or self._own or self._buf:
            raise ValueError("only an established channel with nothing buffered shares a buffer")
        self._buf = buf

    def own_buffer(self) -> None:
        """From now on, keep arrived bytes in a buffer of the channel's own, which the caller
        reads into: :meth:`receive_space` gives the room (a writable view, sized for the frame
        in progress), :meth:`receive_into` takes what was read there. Bytes are then decrypted
        where the socket put them, with no copy between. The bytes the channel held (its own,
        or a shared buffer's) move into it. Only for an established channel."""
        if self._state is not _State.ESTABLISHED:
            raise ValueError("only an established channel reads into a buffer of its own")
        if self._own:
            return
        n = len(self._buf) - self._off
        buf = bytearray(max(RECV_INITIAL, n + RECV_ROOM))
        with memoryview(self._buf) as held:
            buf[:n] = held[self._off :]
        self._buf, self._off, self._end, self._own = buf, 0, n, True

    def receive_space(self) -> memoryview:
        """Writable room after the bytes held (:meth:`own_buffer`): the rest of the frame in
        progress, else :data:`RECV_ROOM`, where the buffer holds that much. Held bytes move to
        the front when that makes the room; otherwise the room is what is left, at least
        :data:`RECV_ROOM`: the buffer grows (at least doubling, up to the frame in progress)
        only once reads have nearly filled it, so it grows with what arrives (to at most
        about twice the bytes held), never with what a header announces or with how often
        room is asked for. An empty buffer larger than :data:`RECV_KEEP` is given back
        (:meth:`receive_into`)."""
        if not self._own:
            raise ValueError("receive_space needs own_buffer first")
        buf, off, end = self._buf, self._off, self._end
        want = RECV_ROOM
        if self._pending_len is not None:
            want = max(want, HEADER_SIZE + self._pending_len - (end - off))
        if len(buf) - end < want:
            held = end - off
            if len(buf) - held >= want or (off and len(buf) - held >= RECV_ROOM > len(buf) - end):
                # Moved to the front, the held bytes leave the room (at most once per frame:
                # only a consumed frame leaves bytes behind the front).
                with memoryview(buf) as view:
                    view[:held] = view[off:end]
            elif len(buf) - end < RECV_ROOM:
                # Nearly full: at least double, up to the rest of the frame in progress.
                grown = bytearray(min(held + want, max(2 * len(buf), held + RECV_ROOM)))
                with memoryview(buf) as view:
                    grown[:held] = view[off:end]
                self._buf = buf = grown
            else:  # room for a read: the buffer grows once the reads have filled it
                return memoryview(buf)[end:]
            self._off = 0
            self._end = end = held
        return memoryview(buf)[end:]

    def receive_into(self, n: int) -> list[Event]:
        """:meth:`receive_data` for ``n`` bytes read into :meth:`receive_space`'s room: the
        events they complete, in order. Raises as :meth:`receive_data` does."""
        if self._state is _State.CLOSED:
            raise ChannelClosed(f"channel is closed ({self._close_reason})")
        if not self._own:
            raise ValueError("receive_into needs own_buffer first")
        if not 0 <= n <= len(self._buf) - self._end:
            raise ValueError(f"{n} bytes do not fit the room given ({len(self._buf) - self._end})")
        self._end += n
        return self._process()

    def receive_buffered(self) -> list[Event]:
        """:meth:`receive_data` for a shared buffer (:meth:`share_buffer`): the events the
        bytes now in it complete, in order."""
        if self._state is _State.CLOSED:
            raise ChannelClosed(f"channel is closed ({self._close_reason})")
        return self._process()

    def _process(self) -> list[Event]:
        events: list[Event] = []
        try:
            if self._state is _State.ESTABLISHED:  # every complete frame, in one call
                self._step_frame(events)
            else:
                while self._step(events):
                    pass
            if self._own:
                if self._off == self._end:  # all consumed: the next read starts at the front
                    self._off = self._end = 0
                    if len(self._buf) > RECV_KEEP:  # a large frame's room is given back
                        self._buf = bytearray(RECV_INITIAL)
            elif self._off:
                del self._buf[: self._off]  # one cut for all the frames this call consumed
                self._off = 0
        except ChannelError as exc:
            self._fail(exc, events)
        except Exception as exc:  # defensive: malformed input must never escape as another type
            self._fail(
                ChannelError(f"internal error while parsing input: {type(exc).__name__}: {exc}"),
                events,
            )
        return events

    def receive_eof(self) -> None:
        """The other side closed. Raises if that cut a handshake or a frame short."""
        if self._state is _State.CLOSED:
            return
        if self._state is not _State.ESTABLISHED:
            self._fail(
                HandshakeCut(
                    f"connection closed during the handshake ({self._state.value}, "
                    f"{len(self._buf)} bytes of the next message received)"
                ),
                [],
            )
        if self._held():
            if self._pending_len is None:
                want = f"a {HEADER_SIZE}-byte header"
            else:
                want = f"{HEADER_SIZE + self._pending_len} bytes"
            self._fail(
                FrameError(
                    f"connection closed in the middle of frame {self._recv_seq} "
                    f"({self._held()} bytes received of {want})"
                ),
                [],
            )
        self._kill("closed by peer")

    def send(self, payload: bytes | bytearray | memoryview) -> None:
        """Encrypt ``payload`` as one data frame and queue it."""
        self._send_frame(FRAME_DATA, payload)

    def send_control(self, payload: bytes) -> None:
        """Encrypt ``payload`` as one control frame and queue it."""
        self._send_frame(FRAME_CONTROL, payload)

    def data_to_send(self) -> bytes:
        """Drain and return the queued outgoing bytes (b"" if none)."""
        if not self._out:
            return b""
        out = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        return out

    def take_output(self) -> list[bytes]:
        """Drain the queued outgoing bytes as the list of pieces they were queued in (a frame
        is its header and its ciphertext), for a vectored write without joining them."""
        out = self._out
        self._out = []
        return out

    def bytes_needed(self) -> int:
        """How many more bytes the next step needs (0 if the channel expects no input now)."""
        have = self._held()
        match self._state:
            case _State.WAIT_M1:
                # Ask for the magic first, so a driver reading exactly this much rejects a
                # stranger's bytes at once instead of waiting for a full first message.
                return len(MAGIC) - have if have < len(MAGIC) else M1_SIZE - have
            case _State.WAIT_M2:
                return M2_SIZE - have
            case _State.WAIT_M3:
                return M3_SIZE - have
            case _State.WAIT_M4:
                return M4_SIZE - have
            case _State.ESTABLISHED:
                if self._pending_len is None:
                    return HEADER_SIZE - have
                return HEADER_SIZE + self._pending_len - have
            case _:
                return 0

    def close(self, reason: str = "closed locally") -> None:
        """Mark the channel closed and drop its keys. Idempotent."""
        if self._state is not _State.CLOSED:
            self._kill(reason)

    # ----------------------------------------------------------------- internals

    def _mix(self, data: bytes) -> None:
        self._h = hashlib.sha256(self._h + data).digest()

    def _kill(self, reason: str) -> None:
        self._state = _State.CLOSED
        self._close_reason = reason
        self._buf = bytearray()
        self._off = 0
        self._own = False
        self._end = 0
        self._send_aead = self._recv_aead = None
        self._send_key = None
        self._ephemeral = None
        self._dh = b""

    def _fail(self, exc: ChannelError, events: list[Event]) -> None:
        exc.events = tuple(events)
        self.error = exc
        self._out.clear()
        self._kill(str(exc))
        raise exc

    def _take(self, n: int) -> bytes:
        chunk = bytes(self._buf[:n])
        del self._buf[:n]
        return chunk

    def _exchange(self, private: X25519PrivateKey, public: X25519PublicKey, what: str) -> bytes:
        try:
            return private.exchange(public)
        except ValueError:
            raise HandshakeError(f"{what} is a low-order point (all-zero shared secret)") from None

    def send_parts(self, parts: list, total: int = -1) -> None:
        """Encrypt the byte strings ``parts``, written back to back, as one data frame and queue
        it: the frame :meth:`send` makes of their join (``total``: their bytes, when the caller
        knows them). A large payload under AES-256-GCM is encrypted piece by piece, without
        joining the pieces first (one copy of it fewer)."""
        if len(parts) == 1:
            self._send_frame(FRAME_DATA, parts[0])
            return
        if total < 0:
            total = sum(map(len, parts))
        if self._send_key is None or total < STREAM_MIN:
            self._send_frame(FRAME_DATA, b"".join(parts))
            return
        self._send_frame(FRAME_DATA, parts, total)

    def _send_frame(
        self, ftype: int, payload: bytes | bytearray | memoryview | list, total: int = -1
    ) -> None:
        if self._state is _State.CLOSED:
            raise ChannelClosed(f"channel is closed ({self._close_reason})")
        if self._state is not _State.ESTABLISHED or self._send_aead is None:
            raise ChannelClosed("cannot send before the handshake is complete")
        size = total if total >= 0 else len(payload)
        length = size + TAG_SIZE
        if length > self._max_frame:
            raise ValueError(
                f"payload of {size} bytes does not fit a frame (max_frame {self._max_frame}, "
                f"including the {TAG_SIZE}-byte tag)"
            )
        seq = self._send_seq
        if seq > MAX_SEQ:
            raise CounterExhausted(
                f"send counter exhausted after {MAX_SEQ + 1} frames; a new connection is needed"
            )
        header = _HEADER.pack(length, ftype, seq)
        if total >= 0:
            ciphertext = _seal_pieces(self._send_key, _nonce(seq), header, payload, total)
        else:
            ciphertext = self._send_aead.encrypt(_nonce(seq), payload, header)
        self._send_seq = seq + 1
        self._out.append(header)
        self._out.append(ciphertext)

    def _step(self, events: list[Event]) -> bool:
        """Process one unit of buffered input if complete; True if progress was made."""
        state = self._state
        if state is _State.ESTABLISHED:
            return self._step_frame(events)
        if state is _State.WAIT_M1:
            # Reject non-protocol bytes at the first wrong byte rather than after 64 bytes.
            n = min(len(self._buf), len(MAGIC))
            if self._buf[:n] != MAGIC[:n]:
                raise HandshakeError(
                    f"not a coordinator-free channel: first bytes {bytes(self._buf[:8])!r}"
                )
            if len(self._buf) < M1_SIZE:
                return False
            self._on_m1(self._take(M1_SIZE))
            return True
        if state is _State.WAIT_M2:
            if len(self._buf) < M2_SIZE:
                return False
            self._on_m2(self._take(M2_SIZE))
            return True
        if state is _State.WAIT_M3:
            if len(self._buf) < M3_SIZE:
                return False
            events.append(self._on_m3(self._take(M3_SIZE)))
            return True
        if state is _State.WAIT_M4:
            if len(self._buf) < M4_SIZE:
                return False
            events.append(self._on_m4(self._take(M4_SIZE)))
            return True
        return False

    # Responder: M1 -> M2
    def _on_m1(self, m1: bytes) -> None:
        pre = m1[: len(PREAMBLE)]
        version = int.from_bytes(pre[4:6], "big")
        if version != VERSION:
            raise PeerRejected(
                f"initiator speaks channel version {version}; this node speaks {VERSION}"
            )
        offer = int.from_bytes(pre[6:8], "big")
        if offer & ~(CHACHA20_POLY1305 | AES_256_GCM):
            raise PeerRejected(f"initiator offers unknown ciphers (bits {offer:#06x})")
        off = len(PREAMBLE)
        claimed, target = _IDS.unpack_from(m1, off)
        off += _IDS.size
        tag = m1[off : off + RUN_TAG_SIZE]
        off += RUN_TAG_SIZE
        e_i = m1[off : off + KEY_SIZE]
        self._peer_id = claimed
        if target != self._local_id:
            raise PeerRejected(
                f"initiator (claiming node {claimed}) dialled node {target}, but this is node "
                f"{self._local_id}"
            )
        if not hmac.compare_digest(tag, run_tag(self._run_id)):
            raise PeerRejected(
                f"initiator (claiming node {claimed}) belongs to a different run (run id digest "
                "mismatch)"
            )
        if claimed == self._local_id:
            raise PeerRejected(f"initiator claims to be this node ({claimed})")
        if claimed not in self._roster:
            raise PeerRejected(f"initiator claims node id {claimed}, which is not in the roster")
        if self._allowed is not None and claimed not in self._allowed:
            raise PeerRejected(f"node {claimed} is not an allowed peer (not a neighbour)")
        chosen = next((c for c in self._suites if offer & c), None)
        if chosen is None:
            raise PeerRejected(
                f"initiator (node {claimed}) offers {_offer_names(offer)}; this node accepts "
                f"{', '.join(CIPHER_NAMES[c] for c in self._suites)} (network.cipher)"
            )
        self._suite = chosen
        self._peer_ephemeral = X25519PublicKey.from_public_bytes(e_i)
        self._mix(m1)
        self._mix(self._static_pub)
        self._ephemeral = X25519PrivateKey.generate()
        e_r = _raw_public(self._ephemeral)
        self._mix(e_r)
        suite = _SUITE.pack(chosen)
        self._mix(suite)
        ee = self._exchange(self._ephemeral, self._peer_ephemeral, "initiator ephemeral key")
        es = self._exchange(self._static, self._peer_ephemeral, "initiator ephemeral key")
        self._dh = ee + es
        k2 = _hkdf(self._dh, self._h, b"cfree/v1 responder proof")
        tag2 = ChaCha20Poly1305(k2).encrypt(_ZERO_NONCE, b"", self._h)
        self._mix(tag2)
        self._out.append(e_r + suite + tag2)
        self._state = _State.WAIT_M3

    # Initiator: M2 -> M3
    def _on_m2(self, m2: bytes) -> None:
        assert self._ephemeral is not None and self._peer_id is not None
        e_r, suite, tag2 = m2[:KEY_SIZE], m2[KEY_SIZE : KEY_SIZE + _SUITE.size], m2[-TAG_SIZE:]
        self._peer_ephemeral = X25519PublicKey.from_public_bytes(e_r)
        self._mix(e_r)
        self._mix(suite)
        ee = self._exchange(self._ephemeral, self._peer_ephemeral, "responder ephemeral key")
        peer_static = X25519PublicKey.from_public_bytes(self._roster[self._peer_id])
        es = self._exchange(self._ephemeral, peer_static, "responder roster key")
        self._dh = ee + es
        k2 = _hkdf(self._dh, self._h, b"cfree/v1 responder proof")
        try:
            ChaCha20Poly1305(k2).decrypt(_ZERO_NONCE, tag2, self._h)
        except InvalidTag:
            raise AuthenticationError(
                f"the responder did not prove it holds node {self._peer_id}'s roster key "
                "(impostor, wrong roster key, or a different run)"
            ) from None
        (chosen,) = _SUITE.unpack(suite)
        if chosen not in self._suites:  # authentic (tag2), but not among what was offered
            raise HandshakeError(
                f"node {self._peer_id} chose cipher {chosen}, which this node did not offer"
            )
        self._suite = chosen
        self._mix(tag2)
        self._mix(self._static_pub)
        se = self._exchange(self._static, self._peer_ephemeral, "responder ephemeral key")
        self._dh += se
        k3 = _hkdf(self._dh, self._h, b"cfree/v1 initiator proof")
        tag3 = ChaCha20Poly1305(k3).encrypt(_ZERO_NONCE, b"", self._h)
        self._mix(tag3)
        self._out.append(tag3)
        self._state = _State.WAIT_M4

    # Responder: M3 -> M4, established
    def _on_m3(self, tag3: bytes) -> HandshakeComplete:
        assert self._ephemeral is not None and self._peer_id is not None
        peer_static = self._roster[self._peer_id]
        self._mix(peer_static)
        se = self._exchange(
            self._ephemeral, X25519PublicKey.from_public_bytes(peer_static), "initiator roster key"
        )
        self._dh += se
        k3 = _hkdf(self._dh, self._h, b"cfree/v1 initiator proof")
        try:
            ChaCha20Poly1305(k3).decrypt(_ZERO_NONCE, tag3, self._h)
        except InvalidTag:
            raise AuthenticationError(
                f"the initiator claiming node {self._peer_id} did not prove it holds that node's "
                "roster key"
            ) from None
        self._mix(tag3)
        k4 = self._derive_transport_keys()
        self._out.append(ChaCha20Poly1305(k4).encrypt(_ZERO_NONCE, b"", self._h))
        self._state = _State.ESTABLISHED
        return HandshakeComplete(self._peer_id)

    # Initiator: M4, established
    def _on_m4(self, tag4: bytes) -> HandshakeComplete:
        assert self._peer_id is not None
        k4 = self._derive_transport_keys()
        try:
            ChaCha20Poly1305(k4).decrypt(_ZERO_NONCE, tag4, self._h)
        except InvalidTag:
            raise AuthenticationError(
                f"node {self._peer_id}'s handshake confirmation does not verify"
            ) from None
        self._state = _State.ESTABLISHED
        return HandshakeComplete(self._peer_id)

    def _derive_transport_keys(self) -> bytes:
        okm = _hkdf(self._dh, self._h, b"cfree/v1 transport keys", 3 * KEY_SIZE)
        k_i2r, k_r2i, k4 = okm[:KEY_SIZE], okm[KEY_SIZE : 2 * KEY_SIZE], okm[2 * KEY_SIZE :]
        aead = _AEADS[self._suite]
        self.cipher = CIPHER_NAMES[self._suite]
        if self._initiator:
            self._send_aead, self._recv_aead = aead(k_i2r), aead(k_r2i)
        else:
            self._send_aead, self._recv_aead = aead(k_r2i), aead(k_i2r)
        if self._suite == AES_256_GCM:  # the pieces of a large frame: encrypted one by one
            self._send_key = k_i2r if self._initiator else k_r2i
        self._ephemeral = None
        self._peer_ephemeral = None
        self._dh = b""
        return k4

    def _step_frame(self, events: list[Event]) -> bool:
        """Decrypt every complete frame held, in order (their events appended); True if there
        was at least one. A frame whose header has come but not its body waits as pending."""
        buf = self._buf
        size = self._end if self._own else len(buf)
        aead = self._recv_aead
        assert aead is not None
        progress = False
        while True:
            off = self._off
            if self._pending_len is None:
                if size - off < HEADER_SIZE:
                    return progress
                length, ftype, seq = _HEADER.unpack_from(buf, off)
                if length > self._max_frame:
                    raise FrameTooLarge(
                        f"frame {self._recv_seq} announces {length} bytes, over max_frame "
                        f"{self._max_frame}; refused before reading it"
                    )
                if length < TAG_SIZE:
                    raise FrameError(
                        f"frame {self._recv_seq} announces {length} bytes, shorter than the "
                        f"{TAG_SIZE}-byte authentication tag"
                    )
                expected = self._recv_seq
                if seq != expected:
                    if expected > MAX_SEQ:
                        raise FrameError("peer sent a frame past the 64-bit counter limit")
                    what = (
                        "replayed frame or tampered header"
                        if seq < expected
                        else "frames missing or reordered, or tampered header"
                    )
                    raise FrameError(f"frame sequence number {seq}, expected {expected}: {what}")
                self._pending_len = length
                self._pending_type = ftype
            length = self._pending_len
            end = off + HEADER_SIZE + length
            if size < end:
                return progress
            seq = self._recv_seq
            with memoryview(buf) as view:
                header = bytes(view[off : off + HEADER_SIZE])
                try:
                    plaintext = aead.decrypt(_nonce(seq), view[off + HEADER_SIZE : end], header)
                except InvalidTag:
                    raise FrameError(
                        f"frame {seq} ({length} bytes) failed authentication: ciphertext or "
                        "header tampered, truncated, or encrypted under another key"
                    ) from None
            self._off = end
            self._recv_seq = seq + 1
            self._pending_len = None
            ftype = self._pending_type
            if ftype == FRAME_DATA:
                events.append(MessageReceived(plaintext))
            elif ftype == FRAME_CONTROL:
                events.append(ControlReceived(plaintext))
            else:
                raise FrameError(f"frame {seq} has unknown type {ftype}")
            progress = True
