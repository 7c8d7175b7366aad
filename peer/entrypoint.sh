#!/bin/sh
# Entrypoint of the coordinator-free peer image. The first argument picks the role:
#
#   keygen --nodes N [--port P]  one-shot: a key per node into /cfree/keys/<i>, the roster and
#                                the config (/cfree/config.toml) into the run dir /cfree/run
#   peer                         node $CFREE_NODE_ID: its key from /cfree/key, listening on
#                                0.0.0.0:$CFREE_PORT (default 7000), logs into /cfree/run;
#                                a step line at most every $CFREE_PROGRESS_EVERY s (default 5)
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
    exec cfree peer \
      --config /cfree/run/config.toml \
      --roster /cfree/run/roster.json \
      --key "/cfree/key/node-$id.key" \
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
