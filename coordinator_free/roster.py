"""Node identities: X25519 key files and the public roster of a run.

Key files
---------
Each node has a static X25519 private key, stored unencrypted as PEM PKCS#8 in
``<key_dir>/node-<id>.key``. Key files are created with mode 0600 (the mode is set by the
``open`` call that creates them, so there is never a moment when another user could read them)
inside a directory created with mode 0700, and are never overwritten. :func:`load_private_key`
refuses a key file that group or others can read or write.

Roster file
-----------
The roster is public: it lists every node's address and public key. It is JSON::

    {
      "format": "cfree-roster",
      "version": 1,
      "name": "run",
      "run_id": "<32 lowercase hex chars = 16 random bytes>",
      "nodes": [
        {"id": 0, "host": "127.0.0.1", "port": 40001, "public_key": "<64 hex chars>"},
        ...
      ]
    }

Rules checked by :func:`load_roster` (each violation is a :class:`RosterError` naming the file,
the entry and the field): no other fields; node ids are exactly 0..n-1, each once (entries may
be listed in any order; the :class:`Roster` holds them sorted by id); ``host`` is an IPv4 or
IPv6 address (without brackets) or a host name; ``port`` is an integer in 0..65535, where 0
means "any free port" (used by local runs); ``public_key`` is 32 bytes in hex and is not one of
the low-order points that would make every Diffie-Hellman result zero; no two nodes share a
public key; no two nodes share a ``host:port`` unless the port is 0.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from coordinator_free import rundir
from coordinator_free.errors import CfreeError

FORMAT = "cfree-roster"
VERSION = 1
PUBLIC_KEY_BYTES = 32
RUN_ID_BYTES = 16
MAX_KEY_FILE_BYTES = 64 * 1024
MAX_ROSTER_FILE_BYTES = 64 * 1024 * 1024

_HEX = re.compile(r"[0-9a-fA-F]*")
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


class RosterError(CfreeError, ValueError):
    """A roster or key file is missing, malformed, or does not match."""


class KeyFileError(RosterError):
    """A private key file cannot be used (missing, unreadable, malformed, too open)."""


# --------------------------------------------------------------------------------------------
# Roster data


def _check_host(host: Any) -> str:
    if not isinstance(host, str):
        raise RosterError(f"host must be a string, got {type(host).__name__}")
    if not host:
        raise RosterError("host is empty")
    if host.startswith("[") and host.endswith("]"):
        raise RosterError(f"host {host!r}: write IPv6 addresses without brackets")
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        raise RosterError(f"host {host!r} is neither an IP address nor a valid host name")
    if all(label.isdigit() for label in name.split(".")):
        raise RosterError(f"host {host!r} is not a valid IP address")
    return host


def _check_port(port: Any) -> int:
    if not isinstance(port, int) or isinstance(port, bool):
        raise RosterError(f"port must be an integer, got {port!r}")
    if not 0 <= port <= 65535:
        raise RosterError(f"port {port} is not in 0..65535")
    return port


def _check_public_key(key: Any) -> bytes:
    if isinstance(key, bytearray | memoryview):
        key = bytes(key)
    if not isinstance(key, bytes):
        raise RosterError(f"public key must be bytes, got {type(key).__name__}")
    if len(key) != PUBLIC_KEY_BYTES:
        raise RosterError(
            f"public key is {len(key)} bytes; an X25519 public key is {PUBLIC_KEY_BYTES}"
        )
    # Low-order points give an all-zero shared secret with every private key; the library
    # refuses that exchange, so one trial exchange finds them.
    try:
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(key))
    except ValueError:
        raise RosterError(
            f"public key {key.hex()} is a low-order point, not a usable X25519 key"
        ) from None
    return key


def _check_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str):
        raise RosterError(f"run_id must be a string, got {type(run_id).__name__}")
    if len(run_id) != 2 * RUN_ID_BYTES or not _HEX.fullmatch(run_id):
        raise RosterError(
            f"run_id {run_id!r} must be {2 * RUN_ID_BYTES} hex characters ({RUN_ID_BYTES} bytes)"
        )
    return run_id.lower()


@dataclass(frozen=True)
class RosterEntry:
    """One node: its id, where it listens, and its raw 32-byte X25519 public key."""

    id: int
    host: str
    port: int
    public_key: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.id, int) or isinstance(self.id, bool) or self.id < 0:
            raise RosterError(f"node id must be a non-negative integer, got {self.id!r}")
        _check_host(self.host)
        _check_port(self.port)
        object.__setattr__(self, "public_key", _check_public_key(self.public_key))

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def public_key_hex(self) -> str:
        return self.public_key.hex()


@dataclass(frozen=True)
class Roster:
    """The public description of a run's nodes; ``entries[i].id == i``."""

    run_id: str
    name: str
    entries: tuple[RosterEntry, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_id", _check_run_id(self.run_id))
        if not isinstance(self.name, str) or not self.name:
            raise RosterError(f"name must be a non-empty string, got {self.name!r}")
        entries = tuple(self.entries)
        if not entries:
            raise RosterError("the roster lists no nodes")
        for entry in entries:
            if not isinstance(entry, RosterEntry):
                raise RosterError(f"roster entries must be RosterEntry, got {type(entry).__name__}")
        by_id: dict[int, RosterEntry] = {}
        for entry in entries:
            if entry.id in by_id:
                raise RosterError(f"node id {entry.id} appears more than once")
            by_id[entry.id] = entry
        missing = [i for i in range(len(entries)) if i not in by_id]
        if missing:
            extra = sorted(i for i in by_id if i >= len(entries))
            raise RosterError(
                f"node ids must be exactly 0..{len(entries) - 1}: missing {missing}, "
                f"unexpected {extra}"
            )
        entries = tuple(by_id[i] for i in range(len(entries)))
        seen_keys: dict[bytes, int] = {}
        seen_addr: dict[tuple[str, int], int] = {}
        for entry in entries:
            other = seen_keys.setdefault(entry.public_key, entry.id)
            if other != entry.id:
                raise RosterError(
                    f"nodes {other} and {entry.id} have the same public key "
                    f"{entry.public_key.hex()}"
                )
            if entry.port != 0:
                addr = (entry.host.lower().rstrip("."), entry.port)
                other = seen_addr.setdefault(addr, entry.id)
                if other != entry.id:
                    raise RosterError(
                        f"nodes {other} and {entry.id} have the same address "
                        f"{entry.host}:{entry.port}"
                    )
        object.__setattr__(self, "entries", entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[RosterEntry]:
        return iter(self.entries)

    @property
    def n(self) -> int:
        return len(self.entries)

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(range(len(self.entries)))

    @property
    def run_id_bytes(self) -> bytes:
        return bytes.fromhex(self.run_id)

    def get(self, node_id: int) -> RosterEntry:
        """The entry for ``node_id``; :class:`RosterError` if there is none."""
        if (
            not isinstance(node_id, int)
            or isinstance(node_id, bool)
            or not 0 <= node_id < len(self.entries)
        ):
            raise RosterError(
                f"node {node_id!r} is not in roster {self.name!r} (ids 0..{len(self.entries) - 1})"
            )
        return self.entries[node_id]

    def public_keys(self) -> dict[int, bytes]:
        return {e.id: e.public_key for e in self.entries}

    def addresses(self) -> dict[int, tuple[str, int]]:
        return {e.id: (e.host, e.port) for e in self.entries}

    def with_addresses(self, hosts: Sequence[tuple[str, int]]) -> Roster:
        """The same run and keys with new addresses, one ``(host, port)`` per node."""
        if len(hosts) != len(self.entries):
            raise RosterError(f"{len(hosts)} addresses given for {len(self.entries)} nodes")
        return Roster(
            run_id=self.run_id,
            name=self.name,
            entries=tuple(
                RosterEntry(e.id, h, p, e.public_key)
                for e, (h, p) in zip(self.entries, hosts, strict=True)
            ),
        )

    def to_dict(self) -> dict:
        """The JSON-ready form documented in the module docstring."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "run_id": self.run_id,
            "nodes": [
                {"id": e.id, "host": e.host, "port": e.port, "public_key": e.public_key.hex()}
                for e in self.entries
            ],
        }

    def to_json(self) -> str:
        """The roster file's text: an indented object with one line per node."""
        data = self.to_dict()
        lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in data.items() if k != "nodes"]
        nodes = ",\n".join(f"    {json.dumps(node)}" for node in data["nodes"])
        return "{\n" + "\n".join(lines) + '\n  "nodes": [\n' + nodes + "\n  ]\n}\n"


# --------------------------------------------------------------------------------------------
# Roster files


_TOP_FIELDS = ("format", "version", "name", "run_id", "nodes")
_NODE_FIELDS = ("id", "host", "port", "public_key")


def parse_roster(text: str | bytes, *, source: str = "<roster>") -> Roster:
    """Parse roster JSON; errors start with ``source`` and name the entry and field."""

    def fail(message: str) -> RosterError:
        return RosterError(f"roster {source}: {message}")

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text: {exc}") from None
    if not isinstance(data, dict):
        raise fail(f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise fail(f"format is {data.get('format')!r}, expected {FORMAT!r}")
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        raise fail(f"version {version!r} is not supported (expected {VERSION})")
    unknown = sorted(set(data) - set(_TOP_FIELDS))
    if unknown:
        raise fail(f"unknown fields {unknown}")
    for name in _TOP_FIELDS:
        if name not in data:
            raise fail(f"missing field {name!r}")
    name = data["name"]
    if not isinstance(name, str) or not name:
        raise fail(f"name must be a non-empty string, got {name!r}")
    try:
        run_id = _check_run_id(data["run_id"])
    except RosterError as exc:
        raise fail(str(exc)) from None
    nodes = data["nodes"]
    if not isinstance(nodes, list):
        raise fail(f"nodes must be a list, got {type(nodes).__name__}")
    if not nodes:
        raise fail("nodes is empty")

    entries = []
    position_of_id: dict[int, int] = {}
    for pos, node in enumerate(nodes):
        where = f"nodes[{pos}]"
        if not isinstance(node, dict):
            raise fail(f"{where} must be an object, got {type(node).__name__}")
        if "id" in node:
            where += f" (id {node['id']!r})"
        unknown = sorted(set(node) - set(_NODE_FIELDS))
        if unknown:
            raise fail(f"{where}: unknown fields {unknown}")
        for field_name in _NODE_FIELDS:
            if field_name not in node:
                raise fail(f"{where}: missing field {field_name!r}")
        node_id = node["id"]
        if not isinstance(node_id, int) or isinstance(node_id, bool) or node_id < 0:
            raise fail(f"{where}: id must be a non-negative integer")
        if node_id in position_of_id:
            raise fail(f"{where}: id {node_id} is already used by nodes[{position_of_id[node_id]}]")
        position_of_id[node_id] = pos
        try:
            _check_host(node["host"])
        except RosterError as exc:
            raise fail(f"{where}: {exc}") from None
        try:
            _check_port(node["port"])
        except RosterError as exc:
            raise fail(f"{where}: {exc}") from None
        key_hex = node["public_key"]
        if (
            not isinstance(key_hex, str)
            or len(key_hex) != 2 * PUBLIC_KEY_BYTES
            or not _HEX.fullmatch(key_hex)
        ):
            shown = key_hex if isinstance(key_hex, str) and len(key_hex) <= 80 else "..."
            raise fail(
                f"{where}: public_key must be {2 * PUBLIC_KEY_BYTES} hex characters "
                f"({PUBLIC_KEY_BYTES} bytes), got {shown!r}"
                + (f" of length {len(key_hex)}" if isinstance(key_hex, str) else "")
            )
        try:
            entries.append(RosterEntry(node_id, node["host"], node["port"], bytes.fromhex(key_hex)))
        except RosterError as exc:
            raise fail(f"{where}: {exc}") from None
    try:
        return Roster(run_id=run_id, name=name, entries=tuple(entries))
    except RosterError as exc:
        raise fail(str(exc)) from None


def load_roster(path: str | os.PathLike) -> Roster:
    """Read and validate a roster file; every error is a :class:`RosterError` naming the file.
    A file with the bytes of the one :func:`share_roster` parsed is not parsed again."""
    data = _read_roster(path)
    if _shared is not None and _shared[0] == data:
        return _shared[1]
    return parse_roster(data, source=str(path))


#: The roster :func:`share_roster` parsed, with the bytes it was parsed from.
_shared: tuple[bytes, Roster] | None = None


def share_roster(path: str | os.PathLike) -> Roster:
    """Parse the roster at ``path`` and keep it: :func:`load_roster` of a file with the same
    bytes returns it (a roster is a function of its bytes alone). The fork server does this
    before it forks a run's peers, which then share the one parsed roster instead of each
    checking every entry's key again (a trial key exchange per entry)."""
    global _shared
    data = _read_roster(path)
    ros = parse_roster(data, source=str(path))
    _shared = (data, ros)
    return ros


def _read_roster(path: str | os.PathLike) -> bytes:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_ROSTER_FILE_BYTES + 1)
    except FileNotFoundError:
        raise RosterError(f"roster {path}: file does not exist") from None
    except OSError as exc:
        raise RosterError(f"roster {path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_ROSTER_FILE_BYTES:
        raise RosterError(f"roster {path}: larger than {MAX_ROSTER_FILE_BYTES} bytes")
    return data


def save_roster(path: str | os.PathLike, roster: Roster) -> None:
    """Write ``roster`` to ``path`` atomically (temporary file, fsync, rename), mode 0644."""
    rundir.write_bytes(path, roster.to_json().encode(), mode=0o644)


# --------------------------------------------------------------------------------------------
# Key files


def key_path(key_dir: str | os.PathLike, node_id: int) -> Path:
    """Where node ``node_id``'s private key lives inside ``key_dir``."""
    return rundir.key_path(key_dir, node_id)


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The raw 32-byte public half of ``key``."""
    return key.public_key().public_bytes_raw()


def save_private_key(path: str | os.PathLike, key: X25519PrivateKey) -> None:
    """Write ``key`` as PEM PKCS#8 with mode 0600; refuses to replace an existing file.

    A missing parent directory is created with mode 0700. The file appears under its final
    name only once it is complete (it is written under a temporary name and hard-linked into
    place, which fails if the name is taken).
    """
    if not isinstance(key, X25519PrivateKey):
        raise TypeError(f"expected an X25519PrivateKey, got {type(key).__name__}")
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"key file {path} already exists; refusing to overwrite it")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise FileExistsError(
                f"key file {path} already exists; refusing to overwrite it"
            ) from None
        except OSError:
            # A file system without hard links: fall back to an exclusive create.
            fd = os.open(path, flags, 0o600)
            try:
                os.write(fd, pem)
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        os.unlink(tmp)
    rundir.fsync_dir(path.parent)


def load_private_key(path: str | os.PathLike) -> X25519PrivateKey:
    """Read a node's private key, refusing anything doubtful with a :class:`KeyFileError`."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise KeyFileError(f"key file {path} does not exist") from None
    except IsADirectoryError:
        raise KeyFileError(f"key file {path} is a directory, not a key file") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise KeyFileError(f"key file {path} is a directory, not a key file")
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"key file {path} is not a regular file")
        if os.name == "posix" and st.st_mode & 0o077:
            raise KeyFileError(
                f"key file {path} has mode {stat.S_IMODE(st.st_mode):04o}, so group or others "
                f"can access it; a private key must be private: run  chmod 600 {path}"
            )
        try:
            data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
        except OSError as exc:
            raise KeyFileError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {path} is too large to be a key ({st.st_size} bytes)")
    if b"-----BEGIN " not in data:
        raise KeyFileError(f"key file {path} is not PEM (no '-----BEGIN' line)")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(
            f"key file {path} is password-protected; node key files must be unencrypted"
        ) from None
    except UnsupportedAlgorithm as exc:
        raise KeyFileError(f"key file {path} holds an unsupported key type: {exc}") from None
    except ValueError as exc:
        raise KeyFileError(f"key file {path} is not a valid PEM private key: {exc}") from None
    if not isinstance(key, X25519PrivateKey):
        raise KeyFileError(
            f"key file {path} holds a {type(key).__name__.lstrip('_')} key, not an X25519 key"
        )
    return key


def check_key_matches(roster: Roster, node_id: int, key: X25519PrivateKey) -> None:
    """Raise :class:`RosterError` unless ``key`` is the private half of node ``node_id``'s entry."""
    entry = roster.get(node_id)
    mine = public_bytes(key)
    if mine != entry.public_key:
        raise RosterError(
            f"the private key does not belong to node {node_id} of roster {roster.name!r}: "
            f"its public key is {mine.hex()}, the roster lists {entry.public_key.hex()} "
            "(wrong key file or wrong node id?)"
        )


def generate_keys(
    n: int,
    key_dir: str | os.PathLike,
    *,
    hosts: Sequence[tuple[str, int]] | None = None,
    name: str = "run",
    run_id: str | None = None,
) -> Roster:
    """Make ``n`` fresh node keys in ``key_dir/node-<i>.key`` and return their roster.

    Addresses default to ``127.0.0.1`` port 0; ``run_id`` defaults to 16 random bytes. Nothing
    is written if any of the key files already exists, or if the arguments are invalid. The
    roster itself is not saved: see :func:`save_roster`.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise RosterError(f"the number of nodes must be a positive integer, got {n!r}")
    if hosts is None:
        hosts = [("127.0.0.1", 0)] * n
    hosts = list(hosts)
    if len(hosts) != n:
        raise RosterError(f"{len(hosts)} addresses given for {n} nodes")
    run_id = secrets.token_hex(RUN_ID_BYTES) if run_id is None else run_id
    keys = [X25519PrivateKey.generate() for _ in range(n)]
    # Validate everything (addresses, run id, duplicates) before writing a single file.
    roster = Roster(
        run_id=run_id,
        name=name,
        entries=tuple(
            RosterEntry(i, host, port, public_bytes(k))
            for i, (k, (host, port)) in enumerate(zip(keys, hosts, strict=True))
        ),
    )
    key_dir = Path(key_dir)
    taken = [str(key_path(key_dir, i)) for i in range(n) if key_path(key_dir, i).exists()]
    if taken:
        raise FileExistsError(
            f"key files already exist, refusing to overwrite them: {', '.join(taken)}"
        )
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for i, k in enumerate(keys):
        save_private_key(key_path(key_dir, i), k)
    return roster
