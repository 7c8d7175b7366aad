#!/usr/bin/env bash
# Build the peer image's base image from Debian packages, without any container registry.
#
#   deploy/build-base-image.sh [--tag cfree-base:bookworm] [--suite bookworm]
#                              [--mirror http://deb.debian.org/debian] [--force]
#
# debootstrap installs a minimal Debian (python3 + venv) into a scratch folder, which is then
# imported as a docker image with `docker import`. Point --mirror at a local apt mirror (or
# apt-cacher) on an air-gapped LAN. The image is reused when it already exists (--force rebuilds).
#
# Then build the peer image against it, with the Python wheels fetched beforehand
# (deploy/fetch-wheels.sh) so that the build itself needs no network either:
#
#   deploy/fetch-wheels.sh
#   CFREE_BASE_IMAGE=cfree-base:bookworm CFREE_PIP_OPTIONS=--no-index docker-compose build
set -euo pipefail

tag=cfree-base:bookworm
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-base-image: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

die() { echo "build-base-image: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "debootstrap needs root (run it with sudo)"
command -v docker >/dev/null || die "docker is not installed"
if ! command -v debootstrap >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "== installing debootstrap from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q debootstrap >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q debootstrap >/dev/null; } \
      || die "apt-get install debootstrap failed"
  else
    die "debootstrap is not installed and there is no apt-get to install it"
  fi
fi

if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
  echo "== $tag already exists (use --force to rebuild it)"
  exit 0
fi

root=$(mktemp -d /var/tmp/cfree-rootfs.XXXXXX)
cleanup() { rm -rf --one-file-system "$root"; }
trap cleanup EXIT

echo "== debootstrap $suite from $mirror into $root"
# python3-venv brings ensurepip (pip and setuptools wheels); ca-certificates lets pip reach an
# index when one is reachable.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 20 "$root.log" >&2
  rm -f "$root.log"
  die "debootstrap failed (log tail above)"
}
rm -f "$root.log"

# Keep the image small: no package lists, caches, docs or man pages.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*

echo "== docker import -> $tag"
tar -C "$root" --numeric-owner -c . | docker import \
  -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["/bin/bash"]' \
  -m "coordinator-free base: Debian $suite minbase + python3 (deploy/build-base-image.sh)" \
  - "$tag" >/dev/null
docker run --rm "$tag" python3 -c 'import sys, venv; print("== base image python", sys.version.split()[0])'
echo "== built $tag"
