#!/usr/bin/env bash
# Fill .whl (git-ignored) with the wheels the device image lacks, for bench/gpu_all.sh on a lent GPU: Python 3.12,
# x86-64, the versions constraints.txt and this venv pin. nixl-cu13's expert-parallel extension (three builds of
# ~31 MB, for torch 2.12-2.14, unused by tandem), UCX's perftest and three storage plugins are dropped from its
# wheel so that the tree and the wheels fit the device tool's 64 MiB.
#
#   bash bench/gpu_wheels.sh          # then: run(command="bash bench/gpu_all.sh", carry=[".whl", "tandem/v1"])
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
version() { $PY -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
PACKAGES=(msgspec llguidance grpcio grpcio-health-checking grpcio-reflection grpcio-status protobuf
  googleapis-common-protos fastapi starlette annotated-doc pydantic pydantic-core annotated-types typing-inspection
  uvicorn sse-starlette gguf cryptography cffi pycparser pytest-asyncio opentelemetry-api opentelemetry-sdk
  opentelemetry-semantic-conventions opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-common
  opentelemetry-proto opentelemetry-instrumentation opentelemetry-instrumentation-grpc
  opentelemetry-instrumentation-fastapi opentelemetry-instrumentation-asgi opentelemetry-util-http)
PLATFORMS=()
for p in manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
rm -rf .whl && mkdir .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || grep -qx '/.whl/' .gitignore || echo /.whl/ >>.git/info/exclude
specs=()
for name in "${PACKAGES[@]}"; do
  v=$(version "$name")
  [[ -n $v ]] || { echo "gpu_wheels: $name is not installed here; make install first" >&2; exit 1; }
  specs+=("$name==$v")
done
nixl=$(grep -o '^nixl-cu12==.*' constraints.txt | cut -d= -f3)
specs+=("nixl-cu13==$nixl")
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .whl "${specs[@]}"
work=$(mktemp -d)
wheel=$(ls .whl/nixl_cu13-*.whl)
(cd "$work" && unzip -q "$OLDPWD/$wheel" && rm -rf nixl_ep_cu13 \
  && find . \( -name '*perftest*' -o -name 'libplugin_GPUNETIO.so' -o -name 'libplugin_INFINIA.so' \
    -o -name 'libplugin_GUSLI.so' \) -delete \
  && record=$(ls -d nixl_cu13-*.dist-info)/RECORD \
  && grep -v -E '^(nixl_ep_cu13/|.*perftest|.*libplugin_(GPUNETIO|INFINIA|GUSLI)\.so,)' "$record" >"$record.new" \
  && mv "$record.new" "$record" && rm "$OLDPWD/$wheel" && zip -q -r -9 "$OLDPWD/$wheel" .)
rm -rf "$work"
du -sh .whl
