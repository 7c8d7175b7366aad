#!/usr/bin/env bash
# Fill peer/wheels/ with every wheel the peer image needs, so `docker build` installs the
# project with `pip --no-index` and no network at all.
#
#   deploy/fetch-wheels.sh [--python 3.11] [--platform manylinux2014_x86_64] [--dest peer/wheels]
#
# Run it on any machine that reaches a Python package index (or a local mirror via
# PIP_INDEX_URL), then carry the folder to the air-gapped build host. The wheels target the
# image's Python (Debian bookworm: CPython 3.11, glibc 2.36), not this machine's. The build
# requirements (setuptools, wheel) come along, so pip can build the project from its source.
set -euo pipefail
cd "$(dirname "$0")/.."

py=3.11
platforms=()
dest=peer/wheels
while [ $# -gt 0 ]; do
  case "$1" in
    --python) py=$2; shift 2 ;;
    --platform) platforms+=(--platform "$2"); shift 2 ;;
    --dest) dest=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch-wheels: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
if [ ${#platforms[@]} -eq 0 ]; then
  # Newest first; pip takes the best wheel any of them allows.
  for p in manylinux_2_36_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$p")
  done
fi

mkdir -p "$dest"
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
# The runtime dependencies, read from the project's own pyproject.toml, plus the build backend.
python3 - "$reqs" <<'EOF'
import sys, tomllib
with open("pyproject.toml", "rb") as f:
    meta = tomllib.load(f)
lines = list(meta["project"]["dependencies"]) + list(meta["build-system"]["requires"])
with open(sys.argv[1], "w") as out:
    out.write("\n".join(lines) + "\n")
EOF
echo "== downloading wheels for CPython $py into $dest"
python3 -m pip download --quiet --disable-pip-version-check --dest "$dest" \
  --only-binary=:all: --implementation cp --python-version "$py" "${platforms[@]}" \
  -r "$reqs"
echo "== $(find "$dest" -name '*.whl' | wc -l) wheels in $dest ($(du -sh "$dest" | cut -f1))"
