#!/usr/bin/env bash
# Builds the txnguard image here, where no container registry is reachable:
#   1. a Debian bookworm base from Debian's packages (mmdebstrap), imported into podman's storage;
#   2. the Containerfile on that base (--build-arg BASE=...), chroot isolation; nothing is fetched: the context holds
#      the wheels (txnguard's and its pinned runtime dependencies), downloaded here with the project's pip.
# Both are cached: the base by its package list, the image by the hash of everything it is built from
# (Containerfile, this script, lock, pyproject, README, src/). A rerun with nothing changed only checks that both exist.
# The image is tagged with the package's version (pyproject.toml's, the only place it is written), which its OCI
# labels carry too (org.opencontainers.image.version), as well as with the content hash and latest.
# Prints the image reference on stdout (also written to $CACHE/current); timings go to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${TXNGUARD_IMAGE_CACHE:-$HOME/.cache/txnguard/image}
PODMAN=(podman --cgroup-manager=cgroupfs)
mkdir -p "$CACHE"

# The base: what the Containerfile needs from python:3.11-slim-bookworm (python3 with venv), nothing more.
BASE_PACKAGES=python3,python3-venv
base_key=$(echo "bookworm minbase $BASE_PACKAGES" | sha256sum | cut -c1-12)
BASE=localhost/txnguard-base:bookworm-$base_key
if ! "${PODMAN[@]}" image exists "$BASE"; then
  started=$(date +%s)
  rootfs="$CACHE/rootfs-$base_key.tar"
  if [ ! -s "$rootfs" ]; then  # mmdebstrap picks the output format by the name's extension: keep .tar last
    nice mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" bookworm "$CACHE/partial-$base_key.tar" >&2
    mv "$CACHE/partial-$base_key.tar" "$rootfs"
  fi
  "${PODMAN[@]}" import --quiet "$rootfs" "$BASE" >&2
  echo "base $BASE built in $(( $(date +%s) - started )) s" >&2
fi

image_key=$( { cat Containerfile deploy/container/build-image.sh requirements.lock pyproject.toml README.md;
               find src native -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -not -name '*.so' \
                 -not -path 'native/target/*' | LC_ALL=C sort | xargs cat; } \
             | sha256sum | cut -c1-12)
IMAGE=localhost/txnguard:$image_key
VERSION=$(python3 -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
if ! "${PODMAN[@]}" image exists "$IMAGE"; then
  started=$(date +%s)
  # The build context: the Containerfile and a wheelhouse made with this machine's pip (its index and
  # certificates): txnguard's wheel and the runtime dependencies pyproject.toml names, pinned by the lock.
  context="$CACHE/context-$image_key"
  rm -rf "$context" && mkdir -p "$context/wheels"
  cp Containerfile "$context/"
  python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
    > "$context/runtime.txt"
  PIP=${PIP:-.venv/bin/pip}
  "$PIP" download --quiet --only-binary=:all: -d "$context/wheels" -c requirements.lock -r "$context/runtime.txt" >&2
  # The wheel is built from a copy (maturin: the Python sources and the native data path's crate; its
  # target/ and any editable install's extension left out), so no build output lands in the working tree.
  mkdir "$context/tree" && tar -c --exclude=__pycache__ --exclude='*.egg-info' --exclude=target --exclude='*.so' \
    pyproject.toml README.md src native | tar -x -C "$context/tree"
  "$PIP" wheel --quiet --no-deps -w "$context/wheels" "$context/tree" >&2
  nice "${PODMAN[@]}" build --quiet --isolation=chroot --network=host --build-arg "BASE=$BASE" \
    --build-arg "VERSION=$VERSION" -t "$IMAGE" -t "localhost/txnguard:$VERSION" -t localhost/txnguard:latest \
    "$context" >&2
  rm -rf "$context"
  # Keep the cache bounded: earlier builds of this image and this stage's builder leftovers go.
  "${PODMAN[@]}" images --format '{{.Repository}}:{{.Tag}}' localhost/txnguard \
    | grep -vxF -e "$IMAGE" -e "localhost/txnguard:$VERSION" -e localhost/txnguard:latest \
    | xargs -r "${PODMAN[@]}" rmi >&2 || true
  "${PODMAN[@]}" image prune --force --filter label=org.txnguard.stage=builder >&2 || true
  echo "image $IMAGE built in $(( $(date +%s) - started )) s" >&2
fi
echo "$IMAGE" | tee "$CACHE/current"
