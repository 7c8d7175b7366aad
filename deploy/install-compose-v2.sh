#!/usr/bin/env bash
# Install the Compose v2 CLI plugin (`docker compose`) from Debian's own package, for machines
# whose Docker engine came with only docker-compose v1 and that reach Debian's archive but no
# container or GitHub release registry.
#
#   deploy/install-compose-v2.sh [--suite trixie] [--mirror http://deb.debian.org/debian]
#                                [--dest ~/.docker/cli-plugins]
#
# The .deb is unpacked (not installed with dpkg, so it cannot clash with the engine's packages)
# and only its plugin binary is copied to DEST. Does nothing if `docker compose` already works.
set -euo pipefail

suite=trixie
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
dest=${HOME}/.docker/cli-plugins
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --dest) dest=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-compose-v2: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
die() { echo "install-compose-v2: $*" >&2; exit 1; }

if docker compose version >/dev/null 2>&1; then
  echo "== $(docker compose version) already installed"
  exit 0
fi
for tool in curl xz dpkg-deb; do
  command -v "$tool" >/dev/null || die "$tool is needed"
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== looking up docker-compose in Debian $suite ($mirror)"
curl -fsS -o "$tmp/Packages.xz" "$mirror/dists/$suite/main/binary-amd64/Packages.xz" \
  || die "cannot fetch the $suite package index from $mirror"
xz -dc "$tmp/Packages.xz" >"$tmp/Packages"
# (awk reads the whole index: quitting early would break the pipe under pipefail)
file=$(awk '/^Package: / { pkg = $2 }
  /^Filename: / && pkg == "docker-compose" && !found { print $2; found = 1 }' "$tmp/Packages")
[ -n "$file" ] || die "no docker-compose package in $suite"
curl -fsS -o "$tmp/compose.deb" "$mirror/$file" || die "cannot fetch $mirror/$file"
dpkg-deb -x "$tmp/compose.deb" "$tmp/root"
bin="$tmp/root/usr/libexec/docker/cli-plugins/docker-compose"
[ -x "$bin" ] || die "$file holds no docker-compose plugin binary"
mkdir -p "$dest"
install -m 0755 "$bin" "$dest/docker-compose"
echo "== $(docker compose version) installed to $dest"
