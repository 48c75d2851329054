#!/usr/bin/env bash
# Makes, once per Docker data root, the images an offline build of compose.yaml starts from (no registry needed):
#   tandem/debian-base:bookworm   Debian bookworm + python3, python3-venv, ca-certificates (mmdebstrap, then import)
#   tandem/torch-wheels:host      /wheels = the torch wheel(s) from pip's find-links on this host
#   tandem/docker-cli:host        the docker CLI and its compose plugin found on this host, at Docker's image paths
# then prints the variables compose.offline.yaml reads (eval "$(docker/offline-images.sh)"). It must not build the
# tandem images themselves: `docker compose build` does, with the layer cache.
set -euo pipefail

have() { docker image inspect "$1" >/dev/null 2>&1; }
log() { echo "offline-images: $*" >&2; }

base_image() {
  have tandem/debian-base:bookworm && return
  local mirror rootfs
  # NOTE: grep exits 2 when one of the paths is missing (a deb822-only machine has no sources.list) even though
  # it matched in the other; under pipefail that ended the script with no message
  mirror=$( { grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d \
              2>/dev/null || true; } | head -n1 | awk '{print $2}')
  rootfs=$(mktemp -d)/rootfs.tar
  log "mmdebstrap bookworm from ${mirror:-http://deb.debian.org/debian}"
  nice -n 5 mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}"
  docker import --change 'CMD ["python3"]' "$rootfs" tandem/debian-base:bookworm >/dev/null
  rm -rf "$(dirname "$rootfs")"
}

torch_wheels() {
  have tandem/torch-wheels:host && return
  local links dir
  links=$(pip config get global.find-links 2>/dev/null || echo /opt/wheels)
  dir=$(mktemp -d)
  mkdir "$dir/wheels"
  cp "$links"/torch-*.whl "$dir/wheels/"
  log "torch wheels from $links: $(ls "$dir/wheels")"
  tar -C "$dir" -c wheels | docker import - tandem/torch-wheels:host >/dev/null
  rm -rf "$dir"
}

docker_cli() {
  have tandem/docker-cli:host && return
  local dir plugin
  dir=$(mktemp -d)
  # the docker CLI's own plugin directories, in its search order
  for plugin in ~/.docker/cli-plugins/docker-compose /usr/local/lib/docker/cli-plugins/docker-compose \
                /usr/local/libexec/docker/cli-plugins/docker-compose /usr/lib/docker/cli-plugins/docker-compose \
                /usr/libexec/docker/cli-plugins/docker-compose; do
    test -x "$plugin" && break
  done
  mkdir -p "$dir/usr/local/bin" "$dir/usr/local/libexec/docker/cli-plugins"
  cp "$(command -v docker)" "$dir/usr/local/bin/docker"
  cp "$(readlink -f "$plugin")" "$dir/usr/local/libexec/docker/cli-plugins/docker-compose"
  tar -C "$dir" -c usr | docker import - tandem/docker-cli:host >/dev/null
  rm -rf "$dir"
}

base_image
torch_wheels
docker_cli
# pip in a build trusts the host's CA bundle (a proxy may sign the index's certificate); torch from the wheel
# image first, everything else from the package index
cat <<VARS
export TANDEM_BASE_IMAGE=tandem/debian-base:bookworm
export TANDEM_TORCH_WHEELS=tandem/torch-wheels:host
export TANDEM_TORCH_INDEX=https://pypi.org/simple
export TANDEM_DOCKER_CLI_IMAGE=tandem/docker-cli:host
export TANDEM_CA_BUNDLE=${TANDEM_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
VARS
