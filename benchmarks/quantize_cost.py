"""What `vit-deploy quantize` costs: wall time and peak resident memory, each precision
alone in a fresh process, and the verdict it reached (passed or refused, the worst held-out
image, what the recipe search chose).

    python benchmarks/quantize_cost.py BUNDLE [--precision int8,int8-static,int4]
        [--calib photos] [--json OUT.json]

Each precision runs on a copy of BUNDLE (in a temporary folder, without that precision):
`vit-deploy quantize COPY --precision P --quiet --force` (a failing precision written too,
for its figures), its peak RSS from the kernel's own
accounting of that child (os.wait4). The machine (CPU model, cores), the date and the
versions are printed with the table. Nothing in BUNDLE changes."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import vit_deploy  # noqa: F401  (first: ONNX Runtime's telemetry is off before it loads)
from vit_deploy.reports.machine import cpu_name
from vit_deploy.runtime.cpu import cpu_flags as runtime_cpu_flags


def cpu_flags() -> list[str]:
    have = runtime_cpu_flags() or frozenset()
    return [f for f in ("avx2", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16") if f in have]


def copy_without(bundle: Path, precision: str, where: Path) -> Path:
    """BUNDLE copied to `where`, the precision's entry and file left out."""
    shutil.copytree(bundle, where)
    manifest = json.loads((where / "manifest.json").read_text())
    entry = manifest.get("precisions", {}).pop(precision, None)
    model = manifest.get("models", {}).pop(precision, None)
    for name in {entry and entry.get("file"), model} - {None}:
        manifest.get("files", {}).pop(name, None)
        (where / name).unlink(missing_ok=True)
    (where / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return where


def measure(bundle: Path, precision: str, calib: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="quantize-cost-") as tmp:
        copy = copy_without(bundle, precision, Path(tmp) / "b")
        # --force: a precision that fails the policy is written too, so that its figures
        # are recorded (its verdict stays "fails"; quantize exits 1 for it)
        argv = [sys.executable, "-m", "vit_deploy.cli", "quantize", str(copy), "--precision",
                precision, "--calib", calib, "--quiet", "--force"]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err = proc.stderr.read().decode(errors="replace")
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        row = {"precision": precision, "exit": code, "seconds": round(seconds, 1),
               "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2)}
        entry = json.loads((copy / "manifest.json").read_text()).get("precisions", {}).get(
            precision)
        if entry is None:
            row["refused"] = err.strip().splitlines()[-1:] or ["(no message)"]
            return row
        cases = entry.get("real_images", {}).get("cases", [])
        row["passed"] = entry.get("passed")
        row["worst"] = {f"{c['label']}": round(c["cosine_min"], 5) for c in cases}
        search = entry.get("recipe", {}).get("search")
        if search:
            row["search"] = {"candidates": len(search["steps"]), "met": search["met"],
                             "kept_float": search["kept_float"],
                             "kept_float_share": search["kept_float_share"],
                             "steps": [s["action"] for s in search["steps"]]}
        row["judged_on"] = entry.get("real_images", {}).get("judged_on")
        return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--precision", default="int8,int8-static,int4")
    ap.add_argument("--calib", default="photos")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not (args.bundle / "manifest.json").is_file():
        sys.exit(f"error: {args.bundle} is not a bundle (no manifest.json)")
    import onnxruntime

    machine = {"cpu": cpu_name(), "flags": cpu_flags(), "cores": os.cpu_count(),
               "date": dt.date.today().isoformat(), "onnxruntime": onnxruntime.__version__,
               "bundle": str(args.bundle)}
    print(f"# {machine['cpu']} ({', '.join(machine['flags']) or 'no VNNI / AMX'}), "
          f"{machine['cores']} cores, {machine['date']}, onnxruntime {machine['onnxruntime']}")
    rows = []
    print("| precision | exit | time | peak RSS | verdict | worst held-out image | search |")
    print("|---|---|---|---|---|---|---|")
    for precision in args.precision.split(","):
        r = measure(args.bundle, precision.strip(), args.calib)
        rows.append(r)
        verdict = ("pass" if r.get("passed") else "refused" if "refused" in r else "written, fails")
        worst = ", ".join(f"{k} {v}" for k, v in r.get("worst", {}).items()) or \
            " ".join(r.get("refused", []))[:120]
        s = r.get("search")
        search = (f"{s['candidates']} candidates, {'met' if s['met'] else 'not met'}; kept "
                  f"float: {', '.join(s['kept_float']) or 'none'}") if s else "-"
        print(f"| {r['precision']} | {r['exit']} | {r['seconds']} s | {r['peak_rss_gb']} GB | "
              f"{verdict} | {worst} | {search} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
