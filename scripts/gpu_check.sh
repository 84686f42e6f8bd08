#!/usr/bin/env bash
# The project's GPU checks in one run: the CUDA tests (tests/gpu/ and the CUDA cases of
# tests/unit), a few unit-test files that must also pass where CUDA is present, and the
# figures of scripts/gpu_measure.py. Everything goes to $OUT (default: a new temp dir):
# log.txt, junit.xml, gpu_measure.json.
#
#   bash scripts/gpu_check.sh          # here: detects no GPU, runs what needs none, says so
#
# On the lent H200 (no registry there: pydantic and transformers 5.24 travel as wheels
# in .whl/, see /work/.library/device/README.md), start the command with the pip line:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; bash scripts/gpu_check.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && ! command -v nvidia-smi >/dev/null && PY=.venv/bin/python

# fp32 comparisons with the CPU assume plain fp32 matmuls: no TF32 forced by the image
tf32_env="TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=${TORCH_ALLOW_TF32_CUBLAS_OVERRIDE-unset} NVIDIA_TF32_OVERRIDE=${NVIDIA_TF32_OVERRIDE-unset}"
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE NVIDIA_TF32_OVERRIDE
# a carried transformers that cannot import beside the image's packages: fall back to the image's
if [ -d /tmp/site/transformers ] && ! $PY -c 'import transformers.models.llama.modeling_llama' 2>"$OUT/transformers-import.err"; then
    echo "carried transformers does not import (see transformers-import.err): using the image's" | tee "$OUT/fallback.txt"
    rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info
fi

{
echo "== gpu_check $(date -u +%FT%TZ) on $(hostname), out: $OUT"
echo "TF32 environment before unset: $tf32_env"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
$PY - <<'EOF'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
for mod in ("transformers", "pydantic", "pydantic_core", "typing_extensions", "yaml", "xxhash", "numpy"):
    try:
        m = __import__(mod)
        print(f"  {mod} {getattr(m, '__version__', '?')} ({m.__file__})")
    except Exception as exc:  # noqa: BLE001
        print(f"  {mod} MISSING: {exc}")
EOF
} 2>&1 | tee "$OUT/log.txt"

if ! $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "== no CUDA GPU here: the tests in tests/gpu/ skip, gpu_measure.py measures CPU->CPU transport only" \
        | tee -a "$OUT/log.txt"
    $PY -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee -a "$OUT/log.txt"
    rc=$?
    $PY scripts/gpu_measure.py --cpu-only --transport-mib 16 --streams 4 --reps 2 \
        --out "$OUT/gpu_measure.json" 2>&1 | tee -a "$OUT/log.txt"
    rc=$(( rc || $? ))
    echo "== no GPU: nothing CUDA was checked (rc $rc); results in $OUT" | tee -a "$OUT/log.txt"
    exit $rc
fi

echo "== pytest: CUDA tests and unit tests that must hold with CUDA present" | tee -a "$OUT/log.txt"
timeout "${GPU_CHECK_TEST_TIMEOUT:-240}" $PY -m pytest -v -s -rA -p no:cacheprovider --timeout 180 \
    --junitxml="$OUT/junit.xml" \
    tests/gpu \
    tests/unit/transport/test_transport_roundtrip.py \
    tests/unit/core/test_device.py \
    tests/unit/bubbletea/test_bubbletea_engine.py \
    tests/unit/bubbletea/test_bubbletea_kv_ship.py \
    2>&1 | tee -a "$OUT/log.txt"
tests_rc=$?

echo "== gpu_measure.py" | tee -a "$OUT/log.txt"
timeout "${GPU_CHECK_MEASURE_TIMEOUT:-200}" $PY scripts/gpu_measure.py --out "$OUT/gpu_measure.json" \
    2>&1 | tee -a "$OUT/log.txt"
measure_rc=$?
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv 2>&1 | tee -a "$OUT/log.txt"
echo "== done: tests rc $tests_rc, measure rc $measure_rc; results in $OUT" | tee -a "$OUT/log.txt"
exit $(( tests_rc || measure_rc ))
