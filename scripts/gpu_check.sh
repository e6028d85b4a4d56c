#!/usr/bin/env bash
# GPU check (issues 14, 27): on a machine with CUDA, export the default model, check it on
# cuda and tensorrt for fp32 / fp16 / int8-static against the golden references the bundle
# stores (no torch needed: a machine without a CUDA-enabled torch still proves CUDA and
# TensorRT parity) and, where torch imports, against PyTorch too; bench cpu / cuda /
# tensorrt with and without IO binding, and time TensorRT's cold start with an empty and a
# warm engine cache. Every report goes into OUT.
#   Usage: scripts/gpu_check.sh OUT   (make gpu-check OUT=dir)
#   BUNDLE=dir: use this bundle (exported elsewhere) instead of exporting one here.
#   PROVIDERS="cuda tensorrt" (default), RES=224,448, CHECK_BATCH=1,4, BENCH_BATCH=1,8,
#   RUNS=30: what is checked and measured (PROVIDERS=cpu runs the same steps on the CPU).
set -euo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
BIN=${BIN:-.venv/bin}
PY=$BIN/python
PROVIDERS=${PROVIDERS:-cuda tensorrt}
RES=${RES:-224,448}
CHECK_BATCH=${CHECK_BATCH:-1,4}
BENCH_BATCH=${BENCH_BATCH:-1,8}
RUNS=${RUNS:-30}
mkdir -p "$OUT"
case " $PROVIDERS " in *" cuda "*|*" tensorrt "*) NEED_CUDA=1 ;; *) NEED_CUDA=0 ;; esac
if [ "$NEED_CUDA" = 1 ] && ! "$PY" - <<'PY'
import sys
from vit_deploy.runtime.providers import probe
p = probe("cuda")
if not p.usable:
    print(f"gpu-check: no usable CUDA here ({p.reason}); nothing was run",
          file=sys.stderr)
    sys.exit(3)
PY
then
  echo "gpu-check: CUDA is not available on this machine; no GPU figures were produced" >&2
  exit 3
fi
if "$PY" -c "import torch" > /dev/null 2>&1; then HAVE_TORCH=1; else HAVE_TORCH=0; fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
if [ -n "${BUNDLE:-}" ]; then
  B="$BUNDLE"
else
  B="$OUT/vit-B16-448"
  "$BIN/vit-deploy" export --patch 16 --res 448 --out "$B" --force --quiet --precision fp16,int8-static --calib digits \
    > "$OUT/export.txt" 2>&1
  "$BIN/vit-deploy" target "$B" --target tensorrt --buckets 224,448 --quiet > "$OUT/target-tensorrt.txt" 2>&1 || true
fi
precisions() {  # those of "$@" the bundle has
  "$PY" - "$B" "$@" <<'PY'
import sys
from vit_deploy.runtime.manifest import load_manifest
have = load_manifest(sys.argv[1], verify=False).models
print(",".join(p for p in sys.argv[2:] if p in have))
PY
}
PRECISIONS=$(precisions fp32 fp16 int8-static)
BENCH_PRECISIONS=$(precisions fp32 fp16)
for p in $PROVIDERS; do
  # golden references: every stored case (their sizes, batch 2) and the target's buckets
  "$BIN/vit-deploy" check "$B" --provider $p --precision "$PRECISIONS" --reference bundle \
    --require --json "$OUT/check-golden-$p.json" --markdown "$OUT/check-golden-$p.md" --quiet \
    > "$OUT/check-golden-$p.txt" 2>&1 || true
  if [ "$HAVE_TORCH" = 1 ]; then
    "$BIN/vit-deploy" check "$B" --provider $p --precision "$PRECISIONS" --res "$RES" --batch "$CHECK_BATCH" \
      --reference pytorch --require --json "$OUT/check-$p.json" --markdown "$OUT/check-$p.md" --quiet \
      > "$OUT/check-$p.txt" 2>&1 || true
  fi
done
BENCH_PROVIDERS=$(echo "cpu $PROVIDERS" | tr ' ' '\n' | awk 'NF && !seen[$0]++' | paste -sd, -)
"$BIN/vit-deploy" bench "$B" --provider "$BENCH_PROVIDERS" --precision "$BENCH_PRECISIONS" --res "$RES" --batch "$BENCH_BATCH" \
  --runs "$RUNS" --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1 || true
if [ "$NEED_CUDA" = 1 ]; then
"$BIN/vit-deploy" bench "$B" --provider cuda,tensorrt --precision "$BENCH_PRECISIONS" --res "$RES" --batch "$BENCH_BATCH" \
  --runs "$RUNS" --io-binding --json "$OUT/bench-iobinding.json" > "$OUT/bench-iobinding.txt" 2>&1 || true
fi
case " $PROVIDERS " in *" tensorrt "*)
"$PY" - "$B" "$OUT" <<'PY' > "$OUT/tensorrt-cold-start.txt" 2>&1 || true
import json, shutil, sys, time
from pathlib import Path
import numpy as np
from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.graph_cache import CACHE_DIR
bundle, out = Path(sys.argv[1]), Path(sys.argv[2])
x = np.zeros((1, 3, 448, 448), np.float32)
rows = []
for precision in ("fp32", "fp16"):
    shutil.rmtree(bundle / CACHE_DIR / "tensorrt", ignore_errors=True)
    for cache in ("empty", "warm"):
        t0 = time.perf_counter()
        with ViTSession(bundle, provider="tensorrt", precision=precision, target="none") as s:
            s.run(x)
        rows.append({"precision": precision, "cache": cache, "cold_start_s": time.perf_counter() - t0})
        print(rows[-1])
(out / "tensorrt-cold-start.json").write_text(json.dumps(rows, indent=2))
PY
;; esac
echo "gpu-check: reports in $OUT"
ls "$OUT"
