#!/usr/bin/env bash
# GPU check (issue 14): on a machine with CUDA, export the default model, check it on cuda
# and tensorrt for fp32 / fp16 / int8-static, bench cpu / cuda / tensorrt with and without
# IO binding, and time TensorRT's cold start with an empty and a warm engine cache. Every
# report goes into OUT.  Usage: scripts/gpu_check.sh OUT   (make gpu-check OUT=dir)
set -euo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
BIN=${BIN:-.venv/bin}
PY=$BIN/python
mkdir -p "$OUT"
if ! "$PY" - <<'PY'
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
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
B="$OUT/vit-B16-448"
"$BIN/vit-deploy" export --patch 16 --res 448 --out "$B" --force --quiet --precision fp16,int8-static --calib digits \
  > "$OUT/export.txt" 2>&1
"$BIN/vit-deploy" target "$B" --target tensorrt --buckets 224,448 --quiet > "$OUT/target-tensorrt.txt" 2>&1 || true
for p in cuda tensorrt; do
  "$BIN/vit-deploy" check "$B" --providers $p --precision fp32,fp16,int8-static --res 224,448 --batch 1,4 \
    --require --json "$OUT/check-$p.json" --markdown "$OUT/check-$p.md" --quiet > "$OUT/check-$p.txt" 2>&1 || true
done
"$BIN/vit-deploy" bench "$B" --providers cpu,cuda,tensorrt --precision fp32,fp16 --res 224,448 --batch 1,8 \
  --runs 30 --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1 || true
"$BIN/vit-deploy" bench "$B" --providers cuda,tensorrt --precision fp32,fp16 --res 224,448 --batch 1,8 \
  --runs 30 --io-binding --json "$OUT/bench-iobinding.json" > "$OUT/bench-iobinding.txt" 2>&1 || true
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
echo "gpu-check: reports in $OUT"
ls "$OUT"
