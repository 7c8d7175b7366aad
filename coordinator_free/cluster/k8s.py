"""Kubernetes manifests for a run: one Job per peer, an auditor Job, kustomize to bind them.

``cfree k8s CONFIG --dir DIR`` makes the run's keys on the operator's machine (as ``cfree
keygen`` does, with the in-cluster names ``cfree-peer-<i>.cfree-peers:7000`` in the roster) and
writes a Kustomize directory:

- ``kustomization.yaml``: a Secret per node key (``cfree-key-<i>``, from ``keys/``), a
  ConfigMap with the config and the roster (``cfree-public``), and the resources below;
- ``service.yaml``: the headless Service ``cfree-peers`` that gives every peer pod its DNS name;
- ``pvc.yaml``: the run directory, a ReadWriteMany volume every pod mounts at ``/cfree/run``;
- ``peers.yaml``: a Job per peer (``restartPolicy: Never``, ``backoffLimit: 0``: a peer that
  fails is not started again over its own view log), mounting only its own key Secret (mode
  0400) and the public ConfigMap, with hostname ``cfree-peer-<i>`` and subdomain
  ``cfree-peers``;
- ``auditor.yaml``: a Job that waits until every peer has written its result (or one has and
  the run directory stayed untouched long enough for the rest to be gone, or ``--audit-after``
  seconds have passed), then audits the run directory;
- ``README.md``: the commands.

The image is the peer image of ``peer/Dockerfile`` (``--image``), pushed where the cluster can
pull it. Validated offline (``kubectl kustomize`` then ``kubernetes-validate --strict``), never
run on a cluster here.
"""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import roster as roster_mod
from coordinator_free import rundir
from coordinator_free.cluster.compose import (
    IMAGE,
    PORT,
    ComposeError,
    idle_after,
    node_count,
    run_deadline_s,
)

SERVICE = "cfree-peers"
PUBLIC = "cfree-public"
RUN_CLAIM = "cfree-run"
PUBLIC_MOUNT = "/cfree/public"
RUN_MOUNT = "/cfree/run"
KEY_MOUNT = "/cfree/key"


def peer_name(i: int) -> str:
    return f"cfree-peer-{i}"


def key_secret(i: int) -> str:
    return f"cfree-key-{i}"


def host(i: int, port: int = PORT) -> tuple[str, int]:
    """Node i's address in the roster: its pod's name under the headless Service."""
    return f"{peer_name(i)}.{SERVICE}", port


def _q(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid YAML scalar


def _labels(role: str, indent: int) -> list[str]:
    pad = " " * indent
    return [f"{pad}app.kubernetes.io/name: coordinator-free", f"{pad}cfree/role: {role}"]


def _pod_common(image: str, indent: int) -> list[str]:
    pad = " " * indent
    return [f"{pad}image: {_q(image)}", f"{pad}imagePullPolicy: IfNotPresent"]


def _shared_volumes() -> list[str]:
    """The volumes every pod has: the public ConfigMap and the run directory."""
    return [
        "        - name: public",
        "          configMap:",
        f"            name: {PUBLIC}",
        "        - name: run",
        "          persistentVolumeClaim:",
        f"            claimName: {RUN_CLAIM}",
    ]


def _copy_public() -> list[str]:
    """The init container every pod runs: config and roster into the run directory (the
    auditor reads them there), never over a file already in place."""
    return [
        "      initContainers:",
        "        - name: public-files",
        "          command:",
        '            - "sh"',
        '            - "-c"',
        f"            - {_q(f'cp -n {PUBLIC_MOUNT}/config.toml {PUBLIC_MOUNT}/roster.json {RUN_MOUNT}/')}",
    ]


def render_peer(i: int, image: str, port: int, deadline_s: int) -> str:
    name = peer_name(i)
    lines = [
        "apiVersion: batch/v1",
        "kind: Job",
        "metadata:",
        f"  name: {name}",
        "  labels:",
        *_labels("peer", 4),
        "spec:",
        "  backoffLimit: 0",
        f"  activeDeadlineSeconds: {deadline_s}",
        "  template:",
        "    metadata:",
        "      labels:",
        *_labels("peer", 8),
        f"        cfree/node: {_q(str(i))}",
        "    spec:",
        "      restartPolicy: Never",
        f"      hostname: {name}",
        f"      subdomain: {SERVICE}",
        *_copy_public(),
        *_pod_common(image, 10),
        "          volumeMounts:",
        f"            - {{name: public, mountPath: {PUBLIC_MOUNT}, readOnly: true}}",
        f"            - {{name: run, mountPath: {RUN_MOUNT}}}",
        "      containers:",
        "        - name: peer",
        *_pod_common(image, 10),
        '          args: ["peer"]',
        "          env:",
        f"            - {{name: CFREE_NODE_ID, value: {_q(str(i))}}}",
        f"            - {{name: CFREE_PORT, value: {_q(str(port))}}}",
        f"            - {{name: CFREE_CONFIG, value: {_q(PUBLIC_MOUNT + '/config.toml')}}}",
        f"            - {{name: CFREE_ROSTER, value: {_q(PUBLIC_MOUNT + '/roster.json')}}}",
        "          ports:",
        f"            - {{name: cfree, containerPort: {port}, protocol: TCP}}",
        "          volumeMounts:",
        f"            - {{name: key, mountPath: {KEY_MOUNT}, readOnly: true}}",
        f"            - {{name: public, mountPath: {PUBLIC_MOUNT}, readOnly: true}}",
        f"            - {{name: run, mountPath: {RUN_MOUNT}}}",
        "      volumes:",
        "        - name: key",
        "          secret:",
        f"            secretName: {key_secret(i)}",
        "            defaultMode: 0400",
        *_shared_volumes(),
    ]
    return "\n".join(lines) + "\n"


def render_auditor(n: int, image: str, wait_s: int, idle_s: float) -> str:
    audit = ["audit", "--wait-for", str(n), "--timeout", str(wait_s), "--idle", f"{idle_s:g}"]
    lines = [
        "apiVersion: batch/v1",
        "kind: Job",
        "metadata:",
        "  name: cfree-auditor",
        "  labels:",
        *_labels("auditor", 4),
        "spec:",
        "  backoffLimit: 0",
        "  template:",
        "    metadata:",
        "      labels:",
        *_labels("auditor", 8),
        "    spec:",
        "      restartPolicy: Never",
        *_copy_public(),
        *_pod_common(image, 10),
        "          volumeMounts:",
        f"            - {{name: public, mountPath: {PUBLIC_MOUNT}, readOnly: true}}",
        f"            - {{name: run, mountPath: {RUN_MOUNT}}}",
        "      containers:",
        "        - name: auditor",
        *_pod_common(image, 10),
        "          args: [" + ", ".join(_q(a) for a in audit) + "]",
        "          volumeMounts:",
        f"            - {{name: run, mountPath: {RUN_MOUNT}}}",
        "      volumes:",
        *_shared_volumes(),
    ]
    return "\n".join(lines) + "\n"


def render_service(port: int) -> str:
    return "\n".join([
        "apiVersion: v1",
        "kind: Service",
        "metadata:",
        f"  name: {SERVICE}",
        "  labels:",
        *_labels("peer", 4),
        "spec:",
        "  clusterIP: None",
        "  publishNotReadyAddresses: true",
        "  selector:",
        "    cfree/role: peer",
        "  ports:",
        f"    - {{name: cfree, port: {port}, targetPort: {port}, protocol: TCP}}",
    ]) + "\n"  # fmt: skip


def render_pvc(storage: str) -> str:
    return "\n".join([
        "apiVersion: v1",
        "kind: PersistentVolumeClaim",
        "metadata:",
        f"  name: {RUN_CLAIM}",
        "  labels:",
        *_labels("run", 4),
        "spec:",
        "  accessModes: [ReadWriteMany]",
        "  resources:",
        "    requests:",
        f"      storage: {storage}",
    ]) + "\n"  # fmt: skip


def render_kustomization(n: int) -> str:
    lines = [
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "# Written by `cfree k8s`; regenerate it from the config rather than editing it.",
        "resources:",
        "  - service.yaml",
        "  - pvc.yaml",
        "  - peers.yaml",
        "  - auditor.yaml",
        "generatorOptions:",
        "  disableNameSuffixHash: true",
        "configMapGenerator:",
        f"  - name: {PUBLIC}",
        "    files:",
        f"      - config.toml={rundir.CONFIG}",
        f"      - roster.json={rundir.ROSTER}",
        "secretGenerator:",
    ]
    for i in range(n):
        lines += [
            f"  - name: {key_secret(i)}",
            "    files:",
            f"      - node-{i}.key=keys/node-{i}.key",
        ]
    return "\n".join(lines) + "\n"


def write_k8s(
    cfg: config_mod.Config,
    out_dir: Path,
    *,
    image: str = IMAGE,
    port: int = PORT,
    storage: str = "1Gi",
    audit_after_s: int | None = None,
) -> dict:
    """Write the Kustomize directory of ``cfg`` into ``out_dir`` (which must not hold a run's
    keys yet); return what was written."""
    n = node_count(cfg)
    if n < 2:
        raise ComposeError(f"a cluster needs at least 2 nodes, the config has {n}")
    out_dir = Path(out_dir)
    if (out_dir / "keys").exists() or (out_dir / "kustomization.yaml").exists():
        raise ComposeError(f"{out_dir} already holds manifests or keys; use another --dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / rundir.CONFIG).write_text(cfg.to_toml())
    ros = roster_mod.generate_keys(
        n, out_dir / "keys", hosts=[host(i, port) for i in range(n)], name=cfg.run.name
    )
    roster_mod.save_roster(out_dir / rundir.ROSTER, ros)
    deadline = run_deadline_s(cfg)
    wait = audit_after_s if audit_after_s is not None else deadline
    files = {
        "kustomization.yaml": render_kustomization(n),
        "service.yaml": render_service(port),
        "pvc.yaml": render_pvc(storage),
        "peers.yaml": "---\n".join(render_peer(i, image, port, deadline) for i in range(n)),
        "auditor.yaml": render_auditor(n, image, wait, idle_after(cfg)),
        "README.md": readme(n, image),
    }
    for name, text in files.items():
        (out_dir / name).write_text(text)
    return {"dir": str(out_dir), "nodes": n, "files": sorted(files), "image": image}


def readme(n: int, image: str) -> str:
    return f"""# coordinator-free on Kubernetes: {n} peers

Written by `cfree k8s`. Validated offline (`kubectl kustomize` and `kubernetes-validate
--strict`); not run on a cluster by the project's own tests.

The keys in `keys/` were made on this machine: each becomes a Secret (`cfree-key-<i>`) that
only peer i's pod mounts. Keep this directory private.

```sh
# the peer image, where the cluster pulls from (a registry, or loaded into each node):
docker build -f peer/Dockerfile -t {image} .
kubectl apply -k .                      # Secrets, ConfigMap, Service, volume, {n} peer Jobs, auditor
kubectl get jobs -l app.kubernetes.io/name=coordinator-free
kubectl logs job/cfree-auditor          # the audit, once every peer has finished
kubectl delete -k .                     # everything, the run volume included
```

The run directory (view logs, results, `audit.json`) is the ReadWriteMany volume `cfree-run`;
read it from any pod that mounts it, e.g. `kubectl cp`. The cluster needs a storage class that
offers ReadWriteMany (NFS, CephFS, ...).
"""
