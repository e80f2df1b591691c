#!/usr/bin/env bash
# Build the proxy's image (deploy/Containerfile) on this machine, with no registry:
#   scripts/build-image.sh PYTHON [TAG]
# PYTHON makes the wheels (the venv `make test` builds). Without a container daemon or
# a reachable registry (see docs/deploy.md), the base is made from Debian's packages
# with mmdebstrap and imported once (cached under .cache/image); buildah then builds
# the Containerfile on it, in chroot isolation. Installs buildah, podman and mmdebstrap
# from Debian's packages when they are missing (as root). Prints the image's name.
set -euo pipefail
python=${1:?usage: build-image.sh PYTHON [TAG]}
tag=${2:-localhost/pd-policy-proxy:test}
base=localhost/pd-policy-base:bookworm
cache=.cache/image
store=(--storage-driver vfs)

if ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah podman mmdebstrap >&2
fi
mkdir -p "$cache"
if ! podman "${store[@]}" image exists "$base"; then
  if [ ! -s "$cache/base.tar" ]; then
    mmdebstrap --variant=apt --include=python3,python3-venv,ca-certificates,passwd \
      bookworm "$cache/base.tar.part" >&2
    mv "$cache/base.tar.part" "$cache/base.tar"
  fi
  podman "${store[@]}" import "$cache/base.tar" "$base" >&2
fi
rm -rf deploy/wheels
"$python" -m pip wheel --quiet --disable-pip-version-check '.[http]' --wheel-dir deploy/wheels >&2
buildah "${store[@]}" bud --quiet --isolation chroot --build-arg "BASE=$base" \
  -t "$tag" -f deploy/Containerfile deploy >&2
rm -rf deploy/wheels
echo "$tag"
