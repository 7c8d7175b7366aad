"""Docker Swarm stacks: one job per peer, an auditor job, keys as Swarm secrets.

``cfree stack CONFIG --dir DIR`` makes the run's keys on the operator's machine (as ``cfree
keygen`` does, with the in-stack names ``peer-<i>:7000`` in the roster) and writes:

- ``docker-stack.yml``, for ``docker stack deploy``:

  - a secret per node key (``keys/node-<i>.key``), mounted only into peer i's container at
    ``/cfree/key/node-<i>.key``, mode 0400;
  - the config and the roster as Swarm configs, mounted into every container under
    ``/cfree/public``;
  - the overlay network ``cfree``; each peer is reached by its service name, resolved to its
    container's own address (``endpoint_mode: dnsrr``, no virtual IP in between);
  - ``peer-<i>``: a ``replicated-job`` with ``restart_policy: none`` (a job's default is to
    restart, which would start a peer again over its own view log);
  - ``auditor``: a job on a manager node that waits until every peer has a result (or one has
    and the run directory stayed untouched long enough for the rest to be gone), then audits;
  - the run directory as a bind mount (``$CFREE_RUN_DIR``, by default ``DIR/run``), which must
    exist on every host that runs a peer;
  - with ``--groups K``, peer i runs only on nodes labelled ``cfree.group=<i mod K>``, to spread
    the peers over LAN hosts;
- ``run/``: the run directory, already holding the config and the roster (the auditor reads
  them there);
- ``README.md``: the commands.

Secret and config names carry the run id: a new run never collides with an earlier stack's
(Swarm secrets cannot be changed in place). Nothing is restarted, nothing is pulled
(``--resolve-image never``): the image must be on every host (a registry, or ``docker save |
docker load``).

The stack names the image by its **ID** (``sha256:<64 hex>``), resolved with ``docker image
inspect`` when the stack is written, or by a digest given as such (``name@sha256:...``); never by
a tag alone. Given a tag, every node's Swarm agent asks the tag's registry for it before it starts
a task, even under ``--resolve-image never``: on an air-gapped node each such lookup waits for a
DNS timeout (10 s), one task after another, long enough for the first peers to give up on the
late ones. An image ID is unchanged by ``docker save | docker load``, and no registry is asked
for one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import roster as roster_mod
from coordinator_free import rundir
from coordinator_free.cluster.compose import (
    IMAGE,
    PORT,
    RUN_MOUNT,
    ComposeError,
    describe,
    idle_after,
    node_count,
    run_deadline_s,
    service,
)
from coordinator_free.cluster.shiplogs import COLLECTOR_FILE, make_collector

STACK_FILE = "docker-stack.yml"
PUBLIC_MOUNT = "/cfree/public"
KEY_MOUNT = "/cfree/key"
NETWORK = "cfree"
#: The log collector: the auditor's service name on the overlay network, and its port.
COLLECTOR_HOST = "auditor"
COLLECT_PORT = 7001
#: The node label ``--groups`` places peers by.
GROUP_LABEL = "cfree.group"


#: An image ID as ``docker image inspect`` gives it, and a digest reference.
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
IMAGE_DIGEST = re.compile(r"[^@\s]+@sha256:[0-9a-f]{64}")


def pinned(ref: str) -> bool:
    """Whether ``ref`` names one image without any tag lookup: an ID or a digest reference."""
    return bool(IMAGE_ID.fullmatch(ref) or IMAGE_DIGEST.fullmatch(ref))


def resolve_image(ref: str, *, docker: str = "docker") -> str:
    """The reference the stack writes for ``ref``: an ID or a digest as given; a name (tag) is
    resolved to the ID of the image it names here (``docker image inspect``). No node looks a
    tag up then, so none ever asks a registry (see the module's docstring)."""
    if pinned(ref):
        return ref
    exe = shutil.which(docker)
    if exe is None:
        raise ComposeError(
            f"--image {ref}: a tag cannot go into the stack (every node would ask a registry for "
            "it), and there is no docker here to resolve it to its image ID; give the ID "
            "(`docker image inspect --format '{{.Id}}' IMAGE` where it is built) or a digest "
            "(name@sha256:...)"
        )
    r = subprocess.run(
        [exe, "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    image_id = r.stdout.strip()
    if r.returncode != 0 or not IMAGE_ID.fullmatch(image_id):
        said = (r.stderr or r.stdout).strip().splitlines()
        why = said[-1] if said else "docker image inspect failed"
        raise ComposeError(
            f"--image {ref}: not an image here ({why}); build or load it first (`docker build "
            f"-f peer/Dockerfile -t {ref} .`), or give its ID (sha256:...) or a digest "
            "(name@sha256:...)"
        )
    return image_id


def _q(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid YAML scalar


def key_secret(i: int) -> str:
    return f"key-{i}"


def render(
    n: int,
    *,
    run_id: str,
    describe: str,
    run_dir: str,
    image: str,
    port: int = PORT,
    groups: int = 0,
    audit_timeout_s: int = 3600,
    audit_idle_s: float = 40.0,
    ship_logs: bool = True,
) -> str:
    """The text of the stack file (deterministic: same inputs, same bytes). ``ship_logs``: each
    peer sends its finished log and result to the auditor's collector (cluster/shiplogs.py), so
    the run directories need not be one shared disk."""
    if n < 2:
        raise ComposeError(f"a cluster needs at least 2 nodes, the config has {n}")
    if groups < 0:
        raise ComposeError(f"--groups must be 0 (no placement) or more, got {groups}")
    if not pinned(image):
        raise ComposeError(
            f"image {image!r} is a tag: the stack names the image by ID (sha256:...) or digest "
            "(name@sha256:...), so that no node asks a registry (resolve_image)"
        )
    tag = run_id[:12]
    run_mount = [
        "      - type: bind",
        f"        source: {_q('${CFREE_RUN_DIR:-' + run_dir + '}')}",
        f"        target: {RUN_MOUNT}",
    ]
    public = [
        "    configs:",
        "      - source: config",
        f"        target: {PUBLIC_MOUNT}/config.toml",
        "      - source: roster",
        f"        target: {PUBLIC_MOUNT}/roster.json",
    ]
    if ship_logs:
        public += [
            "      - source: collector",
            f"        target: {PUBLIC_MOUNT}/{COLLECTOR_FILE}",
        ]

    def job(constraints: list[str]) -> list[str]:
        out = [
            "    deploy:",
            "      mode: replicated-job",
            "      restart_policy:",
            "        condition: none",
        ]
        if constraints:
            out += ["      placement:", "        constraints:"]
            out += [f"          - {_q(c)}" for c in constraints]
        return out

    lines = [
        f"# coordinator-free Swarm stack: {describe}.",
        "# Written by `cfree stack`; regenerate it from the config rather than editing it.",
        "#",
        "#   docker stack deploy --resolve-image never -c docker-stack.yml cfree",
        "#",
        "# Each peer is a job that is never restarted; it mounts only its own key secret. The",
        f"# auditor writes audit.json into the run directory ${{CFREE_RUN_DIR:-{run_dir}}}",
        "# (a bind mount that must exist on every host). See README.md next to this file.",
        'version: "3.9"',
        "",
        "services:",
    ]
    for i in range(n):
        constraints = [f"node.labels.{GROUP_LABEL} == {i % groups}"] if groups else []
        lines += [
            f"  {service(i)}:",
            f"    image: {_q(image)}",
            '    command: ["peer"]',
            f"    hostname: {_q(service(i))}",
            "    init: true",
            "    environment:",
            f"      CFREE_NODE_ID: {_q(str(i))}",
            f"      CFREE_PORT: {_q(str(port))}",
            f"      CFREE_CONFIG: {_q(PUBLIC_MOUNT + '/config.toml')}",
            f"      CFREE_ROSTER: {_q(PUBLIC_MOUNT + '/roster.json')}",
            *(
                [f"      CFREE_COLLECTOR: {_q(PUBLIC_MOUNT + '/' + COLLECTOR_FILE)}"]
                if ship_logs
                else []
            ),
            "    networks:",
            f"      - {NETWORK}",
            "    volumes:",
            *run_mount,
            "    secrets:",
            f"      - source: {key_secret(i)}",
            f"        target: {KEY_MOUNT}/node-{i}.key",
            "        mode: 0400",
            *public,
            *job(constraints),
            "      endpoint_mode: dnsrr",
        ]
    audit_cmd = ["audit", "--wait-for", str(n), "--timeout", str(audit_timeout_s)]
    audit_cmd += ["--idle", f"{audit_idle_s:g}"]
    if ship_logs:
        audit_cmd += ["--collect-key", f"{KEY_MOUNT}/collector.key"]
        audit_cmd += ["--collect-port", str(COLLECT_PORT)]
    lines += [
        "  auditor:",
        f"    image: {_q(image)}",
        "    command: [" + ", ".join(_q(c) for c in audit_cmd) + "]",
        f"    hostname: {_q(COLLECTOR_HOST)}",
        "    init: true",
        "    networks:",
        f"      - {NETWORK}",
        "    volumes:",
        *run_mount,
    ]
    if ship_logs:
        lines += [
            "    secrets:",
            "      - source: collector-key",
            f"        target: {KEY_MOUNT}/collector.key",
            "        mode: 0400",
            *public,
        ]
    lines += [*job(["node.role == manager"]), "      endpoint_mode: dnsrr"]
    lines += ["", "networks:", f"  {NETWORK}:", "    driver: overlay", "", "secrets:"]
    for i in range(n):
        lines += [
            f"  {key_secret(i)}:",
            f"    file: {_q(f'./keys/node-{i}.key')}",
            f"    name: {_q(f'cfree-{tag}-key-{i}')}",
        ]
    if ship_logs:
        lines += [
            "  collector-key:",
            f"    file: {_q('./keys/collector.key')}",
            f"    name: {_q(f'cfree-{tag}-collector-key')}",
        ]
    lines += ["", "configs:"]
    files = [("config", rundir.CONFIG), ("roster", rundir.ROSTER)]
    for name, file in files + ([("collector", COLLECTOR_FILE)] if ship_logs else []):
        lines += [
            f"  {name}:",
            f"    file: {_q('./' + file)}",
            f"    name: {_q(f'cfree-{tag}-{name}')}",
        ]
    return "\n".join(lines) + "\n"


def write_stack(
    cfg: config_mod.Config,
    out_dir: Path,
    *,
    image: str = IMAGE,
    port: int = PORT,
    groups: int = 0,
    run_dir: Path | None = None,
    audit_timeout_s: int | None = None,
    audit_idle_s: float | None = None,
    ship_logs: bool = True,
) -> dict:
    """Write the stack directory of ``cfg`` into ``out_dir`` (which must not hold a run's keys
    yet); return what was written."""
    n = node_count(cfg)
    if n < 2:
        raise ComposeError(f"a cluster needs at least 2 nodes, the config has {n}")
    out_dir = Path(out_dir)
    if (out_dir / "keys").exists() or (out_dir / STACK_FILE).exists():
        raise ComposeError(f"{out_dir} already holds a stack or keys; use another --dir")
    run = Path(run_dir) if run_dir is not None else out_dir / "run"
    if run.exists() and any(run.iterdir()):
        raise ComposeError(f"the run directory {run} is not empty: it may hold an earlier run")
    image_ref, image = image, resolve_image(image)  # before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    hosts = [(service(i), port) for i in range(n)]
    ros = roster_mod.generate_keys(n, out_dir / "keys", hosts=hosts, name=cfg.run.name)
    if ship_logs:
        collector = make_collector(out_dir / "keys" / "collector.key", COLLECTOR_HOST, COLLECT_PORT)
        (out_dir / COLLECTOR_FILE).write_text(collector.to_json() + "\n")
    for where in (out_dir, run):
        where.mkdir(parents=True, exist_ok=True)
        (where / rundir.CONFIG).write_text(cfg.to_toml())
        roster_mod.save_roster(where / rundir.ROSTER, ros)
    deadline = run_deadline_s(cfg)
    idle = audit_idle_s if audit_idle_s is not None else idle_after(cfg)
    text = render(
        n,
        run_id=ros.run_id,
        describe=describe(cfg, n),
        run_dir=str(run.resolve()),
        image=image,
        port=port,
        groups=groups,
        audit_timeout_s=audit_timeout_s if audit_timeout_s is not None else deadline,
        audit_idle_s=idle,
        ship_logs=ship_logs,
    )
    (out_dir / STACK_FILE).write_text(text)
    (out_dir / "README.md").write_text(
        readme(n, image_ref, image, str(run.resolve()), groups, ship_logs)
    )
    return {
        "dir": str(out_dir),
        "stack_file": str(out_dir / STACK_FILE),
        "run_dir": str(run.resolve()),
        "run_id": ros.run_id,
        "nodes": n,
        "image": image,
        "image_ref": image_ref,
        "groups": groups,
        "ship_logs": ship_logs,
    }


def readme(
    n: int, image_ref: str, image: str, run_dir: str, groups: int, ship_logs: bool = True
) -> str:
    gather = (
        "Each peer ships its finished log and result to the auditor's collector (an "
        "authenticated channel, checked by SHA-256; `collected.json` in the auditor's run "
        "directory lists what arrived), so no shared disk is needed: a peer whose files never "
        "arrive is named `missing-log` in the audit, never a smaller loss."
        if ship_logs
        else "This stack does not ship logs (`--no-ship-logs`): unless the run directory is a "
        "shared file system mounted at the same path everywhere, the auditor audits only what "
        "it sees (peers elsewhere show as missing, never as a smaller loss). Gather the logs "
        "on the manager and audit them together:\n\n```sh\nfor h in <host-1> <host-2>; do\n"
        f'  rsync -a "$h:{run_dir}/logs/" {run_dir}/logs/\n'
        f'  rsync -a "$h:{run_dir}/results/" {run_dir}/results/\n'
        f"done\ncfree audit {run_dir}\n```"
    )
    place = (
        f"Peer i runs only on a node labelled `{GROUP_LABEL}=<i mod {groups}>`: label the hosts "
        "before deploying, e.g.\n\n"
        "```sh\n"
        + "".join(
            f"docker node update --label-add {GROUP_LABEL}={g} <host-{g}>\n" for g in range(groups)
        )
        + "```\n"
        if groups
        else "No placement constraint: Swarm spreads the peers over the nodes itself "
        "(`cfree stack --groups K` pins peer i to hosts labelled `cfree.group=<i mod K>`).\n"
    )
    return f"""# coordinator-free on Docker Swarm: {n} peers

Written by `cfree stack`. The keys in `keys/` were made on this machine: each becomes a Swarm
secret that only its peer's container mounts. Keep this directory private.

The stack names the peer image by its ID, `{image}`
(resolved from `{image_ref}` when the stack was written), never by a tag: a node asked for a
tag looks for a registry first, even under `--resolve-image never`, which on an air-gapped
host costs a DNS timeout per task. The ID is the same on every host after `docker save |
docker load`. Rebuilt the image? Write the stack again.

```sh
docker swarm init --advertise-addr <this host's LAN address>   # once, on the manager
docker stack deploy --resolve-image never -c docker-stack.yml cfree
docker service ls --filter label=com.docker.stack.namespace=cfree
docker service logs cfree_auditor                # the audit, once the peers have finished
docker stack rm cfree                            # services, network, secrets and configs
# Swarm keeps the stopped containers of job tasks; once the services are gone:
docker container prune --force --filter label=com.docker.stack.namespace=cfree
```

The run directory `{run_dir}` (a bind mount, override with `CFREE_RUN_DIR`) receives the view
logs, the results and, from the auditor, `audit.json`.

## Across LAN hosts

On every other host: `docker swarm join --token <token> <manager>:2377` (the token is printed
by `docker swarm init`), the peer image (`docker save {image_ref} | ssh host docker load`, or a
registry), and the run directory: `mkdir -p {run_dir}`. Check each host has the very image:
`docker image inspect --format '{{{{.Id}}}}' {image}`.

{place}
Each host's run directory holds the logs of the peers that ran there. {gather}

Swarm keeps the stopped containers of finished job tasks on the node that ran them: after
`docker stack rm cfree`, run the `docker container prune` line above on every host.
"""
