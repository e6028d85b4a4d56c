"""One side of the ARM64 check (scripts/check_arm64.py): run every bundle × precision of
WORKDIR/plan.json on fixed inputs, `vit-deploy predict` on an image and `vit-deploy check
--reference bundle` on each bundle (golden references, bucket graphs included), with the torch-free
runtime of whatever machine runs it — aarch64 in the emulated root file system, x86_64 on
the host. Writes WORKDIR/<name>.npz (outputs) and WORKDIR/<name>.json (machine, versions,
predictions, check exit statuses) and WORKDIR/check-<name>-<recipe>.json (the
check reports).   Usage: python arm64_run.py WORKDIR --name aarch64 [--cli /path/vit-deploy]

Standard library + the runtime only: it must run where torch is not installed.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import vit_deploy  # noqa: F401  (first: ONNX Runtime's telemetry is off before it loads)
import onnxruntime as ort

from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.cpu import int8_kernel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--name", required=True, help="what to call this run (aarch64, x86_64)")
    ap.add_argument("--cli", help="the vit-deploy command (default: this Python -m vit_deploy.cli)")
    args = ap.parse_args()
    work: Path = args.workdir
    plan = json.loads((work / "plan.json").read_text())
    cli = [args.cli] if args.cli else [sys.executable, "-m", "vit_deploy.cli"]

    inputs = dict(np.load(work / plan["inputs"]))
    outputs: dict[str, np.ndarray] = {}
    predictions: dict[str, dict] = {}
    checks: dict[str, dict] = {}  # recipe -> `vit-deploy check` exit status and report file
    for recipe, bundle in plan["bundles"].items():
        for precision in plan["precisions"]:
            key = f"{recipe}/{precision}"
            print(f"{args.name}: {key}", file=sys.stderr, flush=True)
            # the dynamic graph (what the comparison has always measured; the
            # bundle's cpu bucket graphs are `check`'s, below)
            with ViTSession(work / bundle, provider="cpu", precision=precision, target=None) as s:
                active = s.describe()["active"]
                for name, x in inputs.items():
                    outputs[f"{key}/{name}"] = s.run(x)
            # the command an app's user runs, as a subprocess: the installed entry point
            r = subprocess.run([*cli, "predict", str(work / bundle), str(work / plan["image"]),
                                "--precision", precision, "--top-k", str(plan["classes"]), "--target", "none",
                                "--json"],
                               capture_output=True, text=True)
            predictions[key] = {"returncode": r.returncode, "stderr": r.stderr[-2000:],
                                "result": json.loads(r.stdout) if r.returncode == 0 else None,
                                "providers": active}
        # the proof that travels with the bundle: `vit-deploy check` against its golden
        # references (no torch), every precision x stored case, the bucket graphs included
        report = work / f"check-{args.name}-{recipe}.json"
        print(f"{args.name}: {recipe}: vit-deploy check --reference bundle", file=sys.stderr, flush=True)
        r = subprocess.run([*cli, "check", str(work / bundle), "--reference", "bundle",
                            "--json", str(report), "--quiet"], capture_output=True, text=True, check=False)
        checks[recipe] = {"returncode": r.returncode, "report": report.name if report.is_file() else None,
                          "output": (r.stdout + r.stderr)[-4000:]}
    np.savez(work / f"{args.name}.npz", **outputs)
    info = {"machine": platform.machine(), "python": platform.python_version(),
            "onnxruntime": ort.__version__, "numpy": np.__version__,
            "int8_kernel": int8_kernel(), "torch_importable": _importable("torch"),
            "predictions": predictions, "checks": checks}
    (work / f"{args.name}.json").write_text(json.dumps(info, indent=2))
    failed = [k for k, p in predictions.items() if p["returncode"] != 0]
    for k in failed:
        print(f"{args.name}: predict {k} failed:\n{predictions[k]['stderr']}", file=sys.stderr)
    return 1 if failed else 0


def _importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
