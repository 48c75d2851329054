#!/usr/bin/env bash
# One prepared GPU run of everything (issue 27), at most ~8 minutes on one H100, random Llama-3.1-8B-shaped
# weights: pytest -m gpu, bench/gpu_engine.py, bench/gpu_pd.py, bench/kv_tiers_gpu.py (copy), bench/gpu_serve.py.
# Each section is time-boxed and the run goes on past one that fails; the last step writes ONE JSON and the
# target table (bench/gpu_all_report.py). Results land in $OUT (the device tool's folder) or bench/out/gpu-all.
#
#   bash bench/gpu_all.sh               # on the GPU machine (see docs/gpus.md for what to carry there)
#   bash bench/gpu_all.sh --dry-run     # or TANDEM_GPU_DRY_RUN=1: CPU, tiny shapes, every section's code path
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=${TANDEM_GPU_DRY_RUN:-0}
[[ "${1:-}" == "--dry-run" ]] && DRY=1
PY=${PYTHON:-python3}
RESULTS=${OUT:-bench/out/gpu-all}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-all.XXXXXX")
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 TANDEM_CACHE_DIR=${TANDEM_CACHE_DIR:-$WORK/cache} TANDEM_LOG_DIR=$WORK/logs

# wheels the device image lacks travel in .whl (carry it); they go to a private site folder, never the image's
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl \
    || echo "gpu_all: wheel install failed; sections that need them will fail" >&2
  export PYTHONPATH=$PWD:$WORK/site${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
# generated protobuf code is git-ignored: carry tandem/v1, or build it here when grpc_tools is installed
$PY -m services.common.protogen >/dev/null 2>&1 || true

# limits in seconds per section: GPU (sum 465 s) and dry run (a loaded 2-core CPU)
if [[ $DRY == 1 ]]; then
  declare -A LIMIT=([model]=0 [pytest_gpu]=300 [engine]=400 [pd]=400 [kv_tiers]=200 [serve]=400)
  FLAG=--dry-run
else
  declare -A LIMIT=([model]=50 [pytest_gpu]=60 [engine]=180 [pd]=75 [kv_tiers]=25 [serve]=75)
  FLAG=
fi

for name in "${!LIMIT[@]}"; do  # TANDEM_GPU_LIMIT_ENGINE=300 etc. move one section's limit
  var=TANDEM_GPU_LIMIT_${name^^}
  [[ -n ${!var:-} ]] && LIMIT[$name]=${!var}
done

SKIP=" ${TANDEM_GPU_SKIP:-} "  # e.g. TANDEM_GPU_SKIP="kv_tiers model": a rerun leaves out what it has already
section() {  # name, then the command: runs it under its limit, logs it, records exit code and seconds
  local name=$1 start rc
  shift
  [[ $SKIP == *" $name "* ]] && { echo "== $name: skipped (TANDEM_GPU_SKIP)" >&2; return; }
  start=$(date +%s)
  echo "== $name (limit ${LIMIT[$name]} s): $*" >&2
  timeout -k 10 "${LIMIT[$name]}" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  printf '{"section": "%s", "rc": %d, "seconds": %d, "limit_s": %d}\n' "$name" "$rc" "$(($(date +%s) - start))" \
    "${LIMIT[$name]}" >>"$WORK/sections.jsonl"
  tail -n 3 "$WORK/$name.log" >&2
}

MODEL=()
if [[ $DRY != 1 ]]; then  # one random 8B checkpoint for the stacks (gpu_engine.py makes and quantizes its own)
  section model $PY -m tandem.cli model init "$WORK/model" --arch llama --shape llama-3.1-8b --dtype bfloat16 \
    --device cuda
  [[ -f $WORK/model/config.json ]] && MODEL=(--model "$WORK/model")
fi
# only the modules that hold gpu tests: the others import test-only packages the device image lacks
mapfile -t GPU_TESTS < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
section pytest_gpu $PY -m pytest -q -m gpu "${GPU_TESTS[@]}" -p no:cacheprovider --junitxml="$WORK/pytest_gpu.xml"
section engine $PY bench/gpu_engine.py $FLAG --json "$WORK/engine.json"
section pd $PY bench/gpu_pd.py $FLAG "${MODEL[@]}" --json "$WORK/pd.json"
section kv_tiers $PY bench/kv_tiers_gpu.py --sections copy $FLAG --json "$WORK/kv_tiers.json"
section serve $PY bench/gpu_serve.py $FLAG "${MODEL[@]}" --json "$WORK/serve.json"

DEVICE=$($PY -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" 2>/dev/null)
$PY bench/gpu_all_report.py "$WORK" --json "$RESULTS/gpu-all.json" --device "$DEVICE" ${FLAG:+--dry-run} \
  | tee "$RESULTS/gpu-all.md"
rc=${PIPESTATUS[0]}
for f in "$WORK"/*.log; do echo "===== $(basename "$f")"; tail -n 60 "$f"; done >"$RESULTS/gpu-all.log"
rm -rf "$WORK/model" "$WORK/site"
exit "$rc"
