"""Logs without a shared disk: each peer ships its finished view log and result to the auditor.

When the nodes of a deployment have separate disks (a Swarm across hosts, each with its own run
directory), the auditor sees only the logs written on its own host. With a **collector**, each
peer, once its run has ended, sends its view log and its result to the auditor over the same
kind of channel the peers use between themselves (``net/channel.py``: X25519, mutual
authentication against pinned keys, AEAD frames), and the auditor writes them into its run
directory before it audits.

- The collector has its own key pair, made with the stack (``keys/collector.key``, a secret
  mounted only into the auditor). Its public description, ``collector.json`` (address, port,
  public key), is public like the roster. On the channel the collector is node ``n`` (one past
  the last peer), and the channel's run id is the roster's run id with a ``/logs`` suffix, so a
  log channel can never be mistaken for a protocol channel.
- A peer authenticates with its own node key, so the collector accepts node i's files only from
  node i, and a peer sends its files only to the holder of the collector key.
- The peer sends a manifest first: the name, size and SHA-256 of each file as it lies on the
  peer's own disk. The collector checks what arrived against it, byte count and digest, and
  writes a file only when both match; it answers with what it accepted. Every file the
  collector received or refused is listed in ``RUN_DIR/collected.json``. A file that never
  arrives is simply absent, and the audit names it (``missing-log``), never a smaller loss.
- A file the auditor's run directory already holds (a peer on the auditor's own host writes it
  there directly) is kept; if the shipped copy differs, that is recorded in collected.json.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from coordinator_free import roster as roster_mod
from coordinator_free import rundir
from coordinator_free.errors import CfreeError
from coordinator_free.net.channel import (
    ChannelError,
    HandshakeComplete,
    MessageReceived,
    SecureChannel,
)

COLLECTOR_FILE = "collector.json"
COLLECTED_FILE = "collected.json"
DEFAULT_PORT = 7001
CHUNK = 1 << 20
#: The largest file a collector takes (a manifest claiming more is refused before any byte).
MAX_FILE = 1 << 32
#: What a peer ships, by kind: the path in its run directory.
KINDS = ("log", "result")


class ShipError(CfreeError, RuntimeError):
    pass


@dataclass(frozen=True)
class Collector:
    host: str
    port: int
    public_key: bytes

    def to_json(self) -> str:
        return json.dumps(
            {"host": self.host, "port": self.port, "public_key": self.public_key.hex()}, indent=1
        )


def load_collector(path: str | os.PathLike) -> Collector:
    try:
        doc = json.loads(Path(path).read_text())
        key = bytes.fromhex(doc["public_key"])
        if len(key) != 32:
            raise ValueError("public_key must be 32 bytes")
        return Collector(str(doc["host"]), int(doc["port"]), key)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ShipError(f"collector file {path}: {exc}") from None


def make_collector(key_path: Path, host: str, port: int = DEFAULT_PORT) -> Collector:
    """A fresh collector key (saved at ``key_path``, mode 0600) and its public description."""
    if key_path.exists():
        raise FileExistsError(f"{key_path} exists, refusing to overwrite it")
    key = X25519PrivateKey.generate()
    key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    roster_mod.save_private_key(key_path, key)
    return Collector(host, port, roster_mod.public_bytes(key))


def _channel_run_id(ros: roster_mod.Roster) -> bytes:
    return ros.run_id_bytes + b"/logs"


def _keys(ros: roster_mod.Roster, collector_pub: bytes) -> dict[int, bytes]:
    keys = dict(ros.public_keys())
    keys[len(ros.entries)] = collector_pub
    return keys


def _files(run_dir: Path, node: int) -> dict[str, Path]:
    return {"log": rundir.log_path(run_dir, node), "result": rundir.result_path(run_dir, node)}


def _digest(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


async def _pump(ch: SecureChannel, reader, writer, timeout: float) -> list:
    """Flush what the channel queued, then read until it yields events (or needs nothing)."""
    out = ch.data_to_send()
    if out:
        writer.write(out)
        await asyncio.wait_for(writer.drain(), timeout)
    events: list = []
    while not events and ch.bytes_needed():
        data = await asyncio.wait_for(reader.readexactly(ch.bytes_needed()), timeout)
        events = ch.receive_data(data)
        out = ch.data_to_send()
        if out:
            writer.write(out)
            await asyncio.wait_for(writer.drain(), timeout)
    return events


# ------------------------------------------------------------------------------ the peer's end


async def ship_once(
    run_dir: Path, node: int, key: X25519PrivateKey, ros, collector: Collector, timeout: float
) -> dict:
    """Send node's log and result once; return the collector's answer."""
    files = {k: p for k, p in _files(run_dir, node).items() if p.exists()}
    manifest = {k: dict(zip(("size", "sha256"), _digest(p), strict=True)) for k, p in files.items()}
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(collector.host, collector.port), timeout
    )
    try:
        ch = SecureChannel(
            local_id=node,
            static_key=key,
            roster_keys=_keys(ros, collector.public_key),
            run_id=_channel_run_id(ros),
            initiator=True,
            peer_id=len(ros.entries),
        )
        ch.start()
        events = await _pump(ch, reader, writer, timeout)
        if not any(isinstance(e, HandshakeComplete) for e in events):
            raise ShipError(f"no handshake with the collector: {events}")
        ch.send(json.dumps({"node": node, "files": manifest}).encode())
        for path in files.values():
            with path.open("rb") as f:
                for chunk in iter(lambda f=f: f.read(CHUNK), b""):
                    ch.send(chunk)
                    writer.write(ch.data_to_send())
                    await asyncio.wait_for(writer.drain(), timeout)
        events = await _pump(ch, reader, writer, timeout)
        answer = [e for e in events if isinstance(e, MessageReceived)]
        if not answer:
            raise ShipError("the collector did not answer")
        return json.loads(answer[0].payload)
    finally:
        writer.close()


async def ship(
    run_dir: Path,
    node: int,
    key: X25519PrivateKey,
    ros,
    collector: Collector,
    *,
    within_s: float = 120.0,
    say=print,
) -> dict | None:
    """Ship node's finished files, retrying (the collector may start later) for ``within_s``;
    return the collector's answer, or None if it never took them (the audit then names the log
    as missing)."""
    deadline = time.monotonic() + within_s
    delay = 0.5
    last = ""
    while True:
        try:
            answer = await ship_once(run_dir, node, key, ros, collector, timeout=30.0)
        except (
            OSError, TimeoutError, asyncio.IncompleteReadError, ChannelError, ShipError, ValueError
        ) as exc:  # fmt: skip
            last = f"{type(exc).__name__}: {exc}"
        else:
            say(f"node {node}: log and result shipped to the collector: {answer}")
            return answer
        if time.monotonic() + delay > deadline:
            say(f"node {node}: could not ship its log to the collector ({last}); giving up")
            return None
        await asyncio.sleep(delay)  # back-off before the next attempt
        delay = min(delay * 2, 5.0)


# ------------------------------------------------------------------------- the collector's end


class LogCollector:
    """The auditor's end: accepts each peer's files on ``port`` and writes the verified ones into
    ``run_dir``."""

    def __init__(self, run_dir: Path, key: X25519PrivateKey, ros, *, say=print):
        self.run_dir = Path(run_dir)
        self.key = key
        self.ros = ros
        self.n = len(ros.entries)
        self.say = say
        self.record: dict[str, dict] = {}
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str = "0.0.0.0", port: int = DEFAULT_PORT) -> int:
        self._server = await asyncio.start_server(self._on_conn, host, port)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        rundir.write_json(self.run_dir / COLLECTED_FILE, self.record)

    async def _on_conn(self, reader, writer) -> None:
        try:
            await self._serve(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ChannelError, ValueError) as e:
            self.say(f"collector: a connection failed: {type(e).__name__}: {e}")
        finally:
            writer.close()

    async def _serve(self, reader, writer, timeout: float = 60.0) -> None:
        ch = SecureChannel(
            local_id=self.n,
            static_key=self.key,
            roster_keys=_keys(self.ros, roster_mod.public_bytes(self.key)),
            run_id=_channel_run_id(self.ros),
            initiator=False,
            allowed_peers=range(self.n),
        )
        events = await _pump(ch, reader, writer, timeout)
        node = next(e.peer_id for e in events if isinstance(e, HandshakeComplete))

        async def message() -> bytes:
            while True:
                for e in await _pump(ch, reader, writer, timeout):
                    if isinstance(e, MessageReceived):
                        return e.payload

        head = json.loads(await message())
        if head.get("node") != node:
            raise ValueError(f"node {node} sent a manifest for node {head.get('node')}")
        answer, entries = {}, {}
        for kind in KINDS:
            want = head["files"].get(kind)
            if want is None:
                continue
            size, sha = int(want["size"]), str(want["sha256"])
            if not 0 <= size <= MAX_FILE:
                raise ValueError(f"node {node} announced a {kind} of {size} bytes")
            h, got = hashlib.sha256(), bytearray()
            while len(got) < size:
                got += await message()
            h.update(got)
            ok = len(got) == size and h.hexdigest() == sha
            entries[kind] = self._store(node, kind, bytes(got), sha, ok)
            answer[kind] = entries[kind]["verdict"]
        self.record[str(node)] = entries  # counted as shipped once all its files are in
        ch.send(json.dumps(answer).encode())
        writer.write(ch.data_to_send())
        await asyncio.wait_for(writer.drain(), timeout)
        self.say(f"collector: node {node}: {answer}")

    def _store(self, node: int, kind: str, data: bytes, sha: str, ok: bool) -> dict:
        path = _files(self.run_dir, node)[kind]
        entry = {"sha256": sha, "size": len(data)}
        if not ok:
            entry["verdict"] = "refused: the bytes do not match the peer's manifest"
        elif path.exists():
            same = _digest(path)[1] == sha
            entry["verdict"] = "already here, identical" if same else "already here, DIFFERENT"
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".part")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            entry["verdict"] = "written"
        return entry
