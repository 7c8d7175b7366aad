"""Fork server: peer processes started from a parent that imported everything once.

A peer started the ordinary way is a fresh interpreter that imports numpy, networkx,
cryptography, uvloop and the protocol families before it can open a socket: about half a
second of CPU per peer, which on a small machine makes the start of a 256-peer run last minutes
and the first steps miss their deadlines. The fork server is one process that imports all of
that once and then, for every peer, forks a child that runs ``cfree peer`` from the already
loaded modules. Each peer is still its own OS process (its own pid, memory, key, sockets and
signals); it only skips the interpreter start and the imports.

Protocol, between the launcher and the server, over a Unix SEQPACKET socket pair (one JSON
object per packet; file descriptors travel with ``SCM_RIGHTS``):

    launcher -> server   {"spawn": id, "argv": [...], "env": {...}, "cwd": ..., "fds": [t...]}
                         with the descriptors [stdin, stdout, stderr, *extra]; the child gets
                         them as 0, 1, 2 and as the numbers ``fds`` lists (e.g. --listen-fd)
                         {"share": id, "config": path, "roster": path}: make the plan of the
                         run configured there and parse its roster, for the children forked
                         after to share (below)
    server -> launcher   {"spawned": id, "pid": pid}  or  {"failed": id, "error": "..."}
                         {"shared": id}
                         {"exited": pid, "code": c}   (c < 0: killed by signal -c)

What a child shares with the server stays shared only while neither writes to it. Two things
would copy it page by page into every child: Python's cycle collector, which writes into the
header of every object it examines (so the server freezes what it has loaded, ``gc.freeze``,
and a child's collections skip it), and each child making the same objects for itself: the
run's plan (at 1024 nodes a dense 8 MiB gossip matrix and the eigenvalue work of its spectral
gap), its roster (every entry's public key checked by a trial key exchange: 90 ms at 1024
nodes), the ``cfree peer`` argument parser. The launcher asks the server to make the plan and
parse the roster once, before the first spawn; a peer forked after finds them
(``families.shared_plan``, ``roster.load_roster``) and makes neither.

When the launcher's end closes (it finished, or died), the server gives the children it still
has ``grace_s`` seconds (60) to end by themselves (a peer whose launcher is gone finds its
progress pipe broken, logs ``aborted`` and stops at its next step), then kills the rest and
exits: no peer outlives its launcher by more than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import traceback

from coordinator_free.errors import CfreeError

#: Modules a peer of any family imports: loaded once by the server, shared copy-on-write by
#: every child.
PRELOAD = (
    "coordinator_free.peer.command",
    "coordinator_free.peer.runner",
    "coordinator_free.peer.budget",
    "coordinator_free.families.averaging.node",
    "coordinator_free.families.averaging.validate",
    "coordinator_free.families.randomized.node",
    "coordinator_free.families.decor.node",
    "coordinator_free.families.decor.validate",
    "coordinator_free.families.learning.node",
    "coordinator_free.families.learning.validate",
    "coordinator_free.families.walk.node",
    "coordinator_free.families.walk.validate",
    "numpy.random",
    "numpy.fft",
    "scipy.sparse",
    "cryptography.hazmat.backends.openssl.backend",
    "threadpoolctl",
    "uvloop",
)

_MAX_FDS = 16
#: The launcher's last message when it closes the server itself (rather than dying): the
#: children still running are killed at once.
SHUTDOWN = b"shutdown"
_PACKET = 1 << 20


class ForkServerError(CfreeError, RuntimeError):
    pass


# ---------------------------------------------------------------- server side


def _preload(modules) -> None:
    for name in modules:
        importlib.import_module(name)
    from coordinator_free import families

    families.families()  # the registry, and every family package with it
    if "coordinator_free.peer.command" in modules:
        _peer_parser()
    if "threadpoolctl" in modules:
        from coordinator_free.blas import one_thread_for_process

        # What every peer does first, done once: the children inherit the limit.
        one_thread_for_process()


def _send(sock: socket.socket, msg: dict) -> None:
    sock.sendall(json.dumps(msg).encode())


def serve(sock: socket.socket, preload=PRELOAD, grace_s: float = 60.0) -> None:
    """The server's loop: fork a child per request, report every child's exit, and end when the
    launcher's end of ``sock`` closes: after the children have ended, or ``grace_s`` seconds
    later, killing those still running (at once when the launcher said :data:`SHUTDOWN`)."""
    _preload(preload)
    gc.freeze()  # what the children share: out of the cycle collector's reach (module doc)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    children: set[int] = set()

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            _send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    try:
        while True:
            ready, _, _ = select.select([sock, wake_r], [], [])
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
            if sock in ready:
                msg, fds, _, _ = socket.recv_fds(sock, _PACKET, _MAX_FDS)
                if not msg:
                    return  # the launcher is gone
                if msg == SHUTDOWN:  # the launcher closes on purpose: no grace for the rest
                    grace_s = 0.0
                    return
                try:
                    req = json.loads(msg)
                    if "share" in req:
                        _share_run(req["config"], req["roster"])
                    else:
                        pid = _fork_child(req, fds, sock, (wake_r, wake_w))
                except Exception as exc:  # a bad request: say so, keep serving
                    _send(sock, {"failed": _req_id(msg), "error": f"{type(exc).__name__}: {exc}"})
                else:
                    if "share" in req:
                        _send(sock, {"shared": req["share"]})
                    else:
                        children.add(pid)
                        _send(sock, {"spawned": req["spawn"], "pid": pid})
                finally:
                    for fd in fds:
                        os.close(fd)
            reap()
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        _end_children(children, grace_s, wake_r)


def _end_children(children: set[int], grace_s: float, wake_r: int) -> None:
    """Wait up to ``grace_s`` for the children to exit (woken by SIGCHLD on ``wake_r``), then
    SIGKILL the rest; reap them all."""
    import time

    deadline = time.monotonic() + grace_s
    while children:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            children.discard(pid)
            continue
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([wake_r], [], [], left)[0]:
            break
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_r, 4096):
                pass
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _req_id(msg: bytes):
    try:
        req = json.loads(msg)
        return req.get("spawn", req.get("share"))
    except (ValueError, AttributeError):
        return None


def _share_run(config_path: str, roster_path: str) -> None:
    """For the children forked from now on: the plan of the config at ``config_path``
    (``families.share_plan``; on one BLAS thread, as a peer makes it: the same bits) and the
    roster at ``roster_path`` (``roster.share_roster``), frozen with the rest (module doc)."""
    from coordinator_free import config as config_mod
    from coordinator_free import roster as roster_mod
    from coordinator_free.blas import one_thread
    from coordinator_free.families import share_plan

    with one_thread():
        share_plan(config_mod.load(config_path))
    roster_mod.share_roster(roster_path)
    gc.freeze()


def _fork_child(req: dict, fds: list[int], sock: socket.socket, server_fds: tuple[int, ...]) -> int:
    argv, env, cwd = req["argv"], req["env"], req["cwd"]
    targets = [0, 1, 2, *req["fds"]]
    if len(fds) != len(targets):
        raise ValueError(f"{len(fds)} descriptors for {len(targets)} targets")
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.close(sock.detach())  # the child has no business with the server's channel
        for fd in server_fds:
            os.close(fd)
        # Move every received descriptor above all the numbers involved, then onto its target:
        # a target may be the number another descriptor arrived as.
        floor = max([*fds, *targets]) + 1
        high = [os.dup(fd) if fd >= floor else _dup_above(fd, floor) for fd in fds]
        for fd in fds:
            os.close(fd)
        for fd, target in zip(high, targets, strict=True):
            os.dup2(fd, target, inheritable=True)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own standard streams
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        import random

        random.seed()
        sys.argv = ["cfree", *argv]
        try:
            code = _peer_command(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        # The exit of an interpreter, minus unwinding into the server's loop (whose clean-up
        # would kill this child's siblings): exit handlers (logging's flush among them), then
        # the standard streams.
        with contextlib.suppress(BaseException):
            import atexit

            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


_parser = None


def _peer_parser():
    """The parser of ``cfree peer``, made once (by the server, for its children to share)."""
    global _parser
    if _parser is None:
        import argparse

        from coordinator_free.peer import command as peer_cli

        parser = argparse.ArgumentParser(prog="cfree")
        sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
        peer_cli.add_parser(sub)
        _parser = parser
    return _parser


def _peer_command(argv: list[str]) -> int:
    """``cfree peer ...``, the one command a fork server runs (argv without the program)."""
    from coordinator_free.peer import command as peer_cli

    return peer_cli.cmd_peer(_peer_parser().parse_args(argv))


def _dup_above(fd: int, floor: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, floor)


def main(argv: list[str]) -> None:
    """``python -m coordinator_free.cluster.forkserver FD GRACE_S [MODULE,...]``: serve on the
    inherited socket FD, preloading the modules (default :data:`PRELOAD`)."""
    sock = socket.socket(fileno=int(argv[0]))
    preload = tuple(argv[2].split(",")) if len(argv) > 2 else PRELOAD
    serve(sock, preload, float(argv[1]))


# ---------------------------------------------------------------- launcher side


class ForkedProcess:
    """A peer forked by the server, with what the launcher uses of an asyncio subprocess:
    ``pid``, ``stdout`` and ``stderr`` stream readers, ``returncode``, ``wait()``, ``kill()``."""

    def __init__(self, pid: int, stdout, stderr, exited: asyncio.Future):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self._exited = exited
        self.returncode: int | None = None
        exited.add_done_callback(self._set_code)

    def _set_code(self, fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.returncode = fut.result()

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class ForkServer:
    """The launcher's handle on a running fork server (:func:`start`)."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, stderr):
        self._proc, self._sock, self._stderr = proc, sock, stderr
        self._next = 0
        self._spawns: dict[int, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future] = {}
        self._early: dict[int, int] = {}
        self._reader: asyncio.Task | None = None
        self._closed = False

    @classmethod
    def start(cls, preload=PRELOAD, grace_s: float = 60.0) -> ForkServer:
        """Start the server process; it imports ``preload`` while the caller goes on (the first
        spawn request waits in the socket until the imports are done). ``grace_s``: how long
        children may outlive the launcher's end of the channel (see the module's doc)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "coordinator_free.cluster.forkserver", str(theirs.fileno()),
                f"{grace_s:g}"]  # fmt: skip
        if preload != PRELOAD:
            argv.append(",".join(preload))
        # The server's own diagnostics (an import that fails) go to a file the error quotes.
        stderr = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
            )
        except BaseException:
            stderr.close()
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(proc, ours, stderr)

    def _why_gone(self, error: Exception | None) -> str:
        try:
            rc = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        said = f": {lines[-1]}" if lines else ""
        if rc is not None:
            return f"the fork server ended (exit status {rc}){said}"
        if error is not None:
            return f"the fork server's channel failed: {error}{said}"
        return f"the fork server closed its channel{said}"

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        error = None
        try:
            while True:
                data = await loop.sock_recv(self._sock, _PACKET)
                if not data:
                    break
                msg = json.loads(data)
                if "spawned" in msg:
                    fut = self._spawns.pop(msg["spawned"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg["pid"])
                elif "shared" in msg:
                    fut = self._spawns.pop(msg["shared"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(None)
                elif "failed" in msg:
                    fut = self._spawns.pop(msg["failed"], None)
                    if fut is not None and not fut.done():
                        fut.set_exception(ForkServerError(f"fork server: {msg['error']}"))
                elif "exited" in msg:
                    fut = self._exits.pop(msg["exited"], None)
                    if fut is None:
                        self._early[msg["exited"]] = msg["code"]
                    elif not fut.done():
                        fut.set_result(msg["code"])
        except (OSError, ValueError) as exc:
            error = exc
        # The server is gone: nothing pending will be answered.
        why = await asyncio.get_running_loop().run_in_executor(None, self._why_gone, error)
        for fut in [*self._spawns.values(), *self._exits.values()]:
            if not fut.done():
                fut.set_exception(ForkServerError(why))
        self._spawns.clear()
        self._exits.clear()

    def _request_id(self) -> int:
        """The id of a new request to the server, its replies read from now on; raises
        ForkServerError when the server is not running."""
        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read())
        if self._reader.done():
            raise ForkServerError("the fork server is not running")
        req_id = self._next
        self._next += 1
        return req_id

    async def share_run(self, config_path, roster_path) -> None:
        """Have the server make the plan of the run configured at ``config_path`` and parse
        its roster at ``roster_path`` (the files its peers' ``--config`` and ``--roster``
        name), for the peers it forks after to share instead of each making their own (module
        doc). Raises ForkServerError when it cannot."""
        loop = asyncio.get_running_loop()
        req_id = self._request_id()
        fut = loop.create_future()
        self._spawns[req_id] = fut
        msg = {"share": req_id, "config": os.path.abspath(config_path),
               "roster": os.path.abspath(roster_path)}  # fmt: skip
        await self._send_fds(json.dumps(msg).encode(), [])
        await fut

    async def spawn(
        self, argv: list[str], *, pass_fds: tuple[int, ...] = (), env: dict | None = None
    ) -> ForkedProcess:
        """Fork a child running ``cfree <argv>`` (a ``cfree peer`` command) with stdin from /dev/null, stdout and stderr to
        pipes (read as ``.stdout`` and ``.stderr``), and ``pass_fds`` under the same numbers."""
        loop = asyncio.get_running_loop()
        req_id = self._request_id()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            msg = json.dumps(
                {
                    "spawn": req_id,
                    "argv": list(argv),
                    "env": dict(os.environ if env is None else env),
                    "cwd": os.getcwd(),
                    "fds": list(pass_fds),
                }
            ).encode()
            fut = loop.create_future()
            self._spawns[req_id] = fut
            await self._send_fds(msg, [devnull, out_w, err_w, *pass_fds])
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            for fd in (devnull, out_w, err_w):
                os.close(fd)
        try:
            pid = await fut
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        exited = loop.create_future()
        if pid in self._early:
            exited.set_result(self._early.pop(pid))
        else:
            self._exits[pid] = exited
        stdout = await _reader_of(out_r)
        stderr = await _reader_of(err_r)
        return ForkedProcess(pid, stdout, stderr, exited)

    async def _send_fds(self, msg: bytes, fds: list[int]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                if fds:
                    socket.send_fds(self._sock, [msg], fds)
                else:
                    self._sock.send(msg)
                return
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(self._sock.fileno(), ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(self._sock.fileno())

    async def close(self) -> None:
        """End the server (it kills any child still running at once) and wait for it."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.send(SHUTDOWN)
        self._sock.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.run_in_executor(None, self._proc.wait), timeout=10)
        except TimeoutError:
            self._proc.kill()
            await loop.run_in_executor(None, self._proc.wait)
        finally:
            self._stderr.close()


async def _reader_of(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_PACKET)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader


if __name__ == "__main__":
    main(sys.argv[1:])
