#!/bin/sh
# Entrypoint of the coordinator-free peer image. The first argument picks the role:
#
#   keygen --nodes N [--port P]  one-shot: a key per node into /cfree/keys/<i>, the roster and
#                                the config (/cfree/config.toml) into the run dir /cfree/run
#   peer                         node $CFREE_NODE_ID: its key from /cfree/key ($CFREE_KEY_DIR),
#                                config and roster from /cfree/run ($CFREE_CONFIG, $CFREE_ROSTER),
#                                listening on 0.0.0.0:$CFREE_PORT (default 7000), logs into
#                                /cfree/run; it does not start when keygen refused (REFUSED);
#                                a step line at most every $CFREE_PROGRESS_EVERY s (default 5);
#                                with $CFREE_COLLECTOR (collector.json), it ships its finished
#                                log and result to the auditor (no shared disk needed)
#   audit                        replay /cfree/run's view logs, write /cfree/run/audit.json
#   anything else                passed to `cfree` (e.g. `plan`, `--help`)
set -eu
role=${1:---help}
[ $# -gt 0 ] && shift
case "$role" in
  keygen|audit)
    exec python -m coordinator_free.cluster.compose "$role" "$@"
    ;;
  peer)
    id=${CFREE_NODE_ID:?set CFREE_NODE_ID to this peer node id}
    keydir=${CFREE_KEY_DIR:-/cfree/key}
    # keygen leaves REFUSED (the reason) in every key volume when it made no keys: say why
    # and do not start. Status 0, because Compose v1 shows no output at all once a service
    # that others depend on fails; nothing ran, and the auditor then leaves the run alone.
    if [ -f "$keydir/REFUSED" ]; then
      echo "cfree peer $id: not started: $(cat "$keydir/REFUSED")" >&2
      exit 0
    fi
    if [ -n "${CFREE_COLLECTOR:-}" ]; then
      set -- --ship-to "$CFREE_COLLECTOR" "$@"
    fi
    exec cfree peer \
      --config "${CFREE_CONFIG:-/cfree/run/config.toml}" \
      --roster "${CFREE_ROSTER:-/cfree/run/roster.json}" \
      --key "$keydir/node-$id.key" \
      --id "$id" \
      --out /cfree/run \
      --listen "0.0.0.0:${CFREE_PORT:-7000}" \
      --progress-fd 1 \
      --progress-every "${CFREE_PROGRESS_EVERY:-5}" \
      "$@"
    ;;
  *)
    exec cfree "$role" "$@"
    ;;
esac
