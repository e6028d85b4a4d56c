"""The ARM64 check's driver (issue 26), run by scripts/check_arm64.sh once the aarch64 root
file system exists: export a tiny bundle here (fp32, int8, int8-static; int8 recipes `any`
and `vnni`; a cpu target with bucket graphs), install the torch-free runtime from a wheel into
the root file system, run there (scripts/arm64_run.py under qemu) `vit-deploy check
--reference bundle` on the bundle's golden references (every precision × stored case ×
provider, buckets included: the proof), and the bundle and `vit-deploy predict` on fixed
inputs, then the same here, and judge aarch64 against x86_64 and PyTorch by the project's
tolerance policy. Speed under emulation means nothing and is not measured.

    scripts/check_arm64.sh [--out DIR] [--recipes any,vnni]     (make check-arm64)

Exit status: 0 every case within policy, 1 a case outside it (or a step failed), 2 usage.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vit_deploy.parity import judge, metrics, sample_inputs  # noqa: E402
from vit_deploy.runtime.contract import COSINE_MIN, FP32_ABS_TOL, tolerance_class  # noqa: E402

PRECISIONS = ("fp32", "int8", "int8-static")
RECIPES = ("any", "vnni")  # quantize --int8-cpu
# fixed inputs: the native size, and a non-square, non-native one
INPUT_SIZES = (((32, 32), 4), ((48, 64), 2))
BUCKETS = "32,48x64"  # vit-deploy target --target cpu --buckets: square native, non-square
CHROOT_VENV = "/opt/vit-deploy/venv"  # inside the root file system
CHROOT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


# --- the report --------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One comparison of aarch64 outputs against another source, over every input."""
    max_abs: float
    cosine: float
    passed: bool
    tolerance: str


@dataclass(frozen=True)
class Row:
    recipe: str  # int8 recipe (--int8-cpu); "-" for fp32
    precision: str
    vs_x86: Side  # aarch64 ORT vs x86_64 ORT, the same file
    vs_torch: Side  # aarch64 ORT vs PyTorch fp32
    x86_vs_torch_cosine: float
    predict: str  # `vit-deploy predict` on aarch64 vs x86_64

    @property
    def passed(self) -> bool:
        return self.vs_x86.passed and self.vs_torch.passed and not self.predict.startswith("failed")


@dataclass(frozen=True)
class CheckRow:
    """One case of `vit-deploy check --reference bundle` run on aarch64: a precision's output
    at a stored reference size, on a provider (cpu, or a bucket graph), against PyTorch fp32."""
    recipe: str  # int8 recipe (--int8-cpu) of the bundle it ran in; "-" for fp32
    precision: str
    case: str  # "32x32 b2"
    provider: str  # "cpu", "cpu (bucket cpu)"
    max_abs: float
    cosine: float | None  # None: not finite (a failure)
    passed: bool


def check_rows(reports: Mapping[str, dict | None]) -> tuple[list[CheckRow], list[str]]:
    """The table of `check --json` reports (int8 recipe -> report in the shared schema, None
    where the check wrote none) and why any report fails as a whole (its own verdict, its
    batch-independence / determinism checks, no cases). fp32 is the same file in every
    recipe's bundle: its rows come from the first report that has them."""
    rows: list[CheckRow] = []
    problems: list[str] = []
    seen_fp32 = False
    for recipe, report in reports.items():
        if not report:
            problems.append(f"{recipe}: the check wrote no report")
            continue
        cases = report.get("cases") or []
        if not cases:
            problems.append(f"{recipe}: the check report has no cases")
        if not report.get("passed"):
            failed = [f"{c.get('name', '?')} {c.get('subject', '')}".strip()
                      for c in report.get("checks") or [] if not c.get("passed", True)]
            problems.append(f"{recipe}: the check failed" + (f" ({', '.join(failed)})" if failed else ""))
        fp32_here = False
        for c in cases:
            if c["precision"] == "fp32":
                if seen_fp32:
                    continue
                fp32_here = True
            rows.append(CheckRow(recipe="-" if c["precision"] == "fp32" else recipe,
                                 precision=c["precision"], case=c["label"], provider=c["provider"],
                                 max_abs=float(c["max_abs"]), cosine=c.get("cosine"),
                                 passed=bool(c["passed"])))
        seen_fp32 |= fp32_here
    order = {p: i for i, p in enumerate(PRECISIONS)}
    rows.sort(key=lambda r: (order.get(r.precision, len(order)), r.recipe, "bucket" in r.provider))
    return rows, problems


@dataclass
class Arm64Report:
    rows: list[Row] = field(default_factory=list)
    machine: dict = field(default_factory=dict)  # what ran on each side
    checks: list[CheckRow] = field(default_factory=list)  # `vit-deploy check` on aarch64
    check_problems: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return (bool(self.rows) and all(r.passed for r in self.rows) and bool(self.checks)
                and all(c.passed for c in self.checks) and not self.check_problems)

    def to_dict(self) -> dict:
        return {"passed": bool(self), "machine": self.machine,
                "check": {"rows": [asdict(c) for c in self.checks], "problems": self.check_problems},
                "rows": [{**asdict(r), "passed": r.passed} for r in self.rows]}

    def check_markdown(self) -> str:
        head = ("| precision | int8 recipe | case | provider | max \\|Δ\\| vs PyTorch fp32 | cosine "
                "| pass |\n|---|---|---|---|---|---|---|\n")
        return head + "".join(
            f"| {c.precision} | {c.recipe} | {c.case} | {c.provider} | {c.max_abs:.1e} "
            f"| {_cos(c.cosine)} | {'pass' if c.passed else 'FAIL'} |\n" for c in self.checks) + "".join(
            f"\n- FAIL: {p}" for p in self.check_problems)

    def markdown(self) -> str:
        head = ("| precision | int8 recipe | aarch64 vs x86_64 max \\|Δ\\| | cosine "
                "| aarch64 vs PyTorch max \\|Δ\\| | cosine | x86_64 vs PyTorch cosine "
                "| predict (aarch64 vs x86_64) | policy |\n|---|---|---|---|---|---|---|---|---|\n")
        return head + "".join(
            f"| {r.precision} | {r.recipe} | {r.vs_x86.max_abs:.1e} | {r.vs_x86.cosine:.6f} "
            f"| {r.vs_torch.max_abs:.1e} | {r.vs_torch.cosine:.6f} | {r.x86_vs_torch_cosine:.6f} "
            f"| {r.predict} | {'pass' if r.passed else 'FAIL'} |\n" for r in self.rows)

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        ct = Table(title="vit-deploy check --reference bundle on aarch64 (qemu), tiny bundle")
        for col in ("precision", "int8 recipe", "case", "provider", "max|Δ| vs PyTorch", "cosine", "pass"):
            ct.add_column(col)
        for r in self.checks:
            ct.add_row(r.precision, r.recipe, r.case, r.provider, f"{r.max_abs:.1e}", _cos(r.cosine),
                      "[green]pass[/]" if r.passed else "[red]FAIL[/]")
        for p in self.check_problems:
            ct.add_row("", "", "", "", "", "", f"[red]FAIL: {p}[/]")
        t = Table(title="aarch64 (qemu) vs x86_64 vs PyTorch fp32, tiny bundle")
        for c in ("precision", "int8 recipe", "vs x86_64 max|Δ|", "cosine", "vs PyTorch max|Δ|",
                  "cosine", "x86_64 vs PyTorch cos", "predict", "policy"):
            t.add_column(c)
        for r in self.rows:
            t.add_row(r.precision, r.recipe, f"{r.vs_x86.max_abs:.1e}", f"{r.vs_x86.cosine:.6f}",
                      f"{r.vs_torch.max_abs:.1e}", f"{r.vs_torch.cosine:.6f}",
                      f"{r.x86_vs_torch_cosine:.6f}", r.predict,
                      "[green]pass[/]" if r.passed else "[red]FAIL[/]")
        return Group(ct, t)


def _cos(cosine: float | None) -> str:
    return "not finite" if cosine is None else f"{cosine:.6f}"


# --- the comparison: one function, to be replaced by `vit-deploy check` against the golden
# references a bundle will carry (the proof issue) ------------------------------------------

Outputs = Mapping[str, np.ndarray]  # "recipe/precision/input" -> logits


def compare_runs(aarch64: Outputs, x86_64: Outputs, reference: Outputs, *,
                 predictions: tuple[dict, dict], recipes: tuple[str, ...],
                 precisions: tuple[str, ...] = PRECISIONS) -> list[Row]:
    """Judge every recipe × precision: aarch64 against x86_64 (the same file, another CPU)
    and against PyTorch fp32 (`reference`: input name -> logits), each by the tolerance
    policy of the precision (vit_deploy.parity.judge), worst case over the inputs."""
    rows = []
    for precision in precisions:
        for recipe in (recipes[:1] if precision == "fp32" else recipes):  # fp32 is one file
            key = f"{recipe}/{precision}"
            names = sorted(n for n in reference)
            vs_x86 = _side([(x86_64[f"{key}/{n}"], aarch64[f"{key}/{n}"]) for n in names], precision)
            vs_torch = _side([(reference[n], aarch64[f"{key}/{n}"]) for n in names], precision)
            x86_cos = min(metrics(reference[n], x86_64[f"{key}/{n}"])["cosine"] for n in names)
            rows.append(Row(recipe="-" if precision == "fp32" else recipe, precision=precision,
                            vs_x86=vs_x86, vs_torch=vs_torch, x86_vs_torch_cosine=x86_cos,
                            predict=_predict_agreement(predictions[0].get(key), predictions[1].get(key))))
    return rows


def _side(pairs: list[tuple[np.ndarray, np.ndarray]], precision: str) -> Side:
    cases = [judge(ref, out, resolution=ref.shape[2:] if ref.ndim > 2 else (0, 0),
                   provider="cpu", precision=precision) for ref, out in pairs]
    policy = tolerance_class(precision)
    tol = (f"max|Δ| ≤ {FP32_ABS_TOL:g}·max(1,|ref|), cos ≥ {COSINE_MIN[policy]}" if policy == "fp32"
           else f"cos ≥ {COSINE_MIN[policy]}")
    return Side(max_abs=max(c.max_abs for c in cases), cosine=min(c.cosine for c in cases),
                passed=all(c.passed for c in cases), tolerance=tol)


def _probabilities(prediction: dict | None) -> np.ndarray | None:
    if not prediction or prediction.get("returncode") != 0 or not prediction.get("result"):
        return None
    top = prediction["result"]["predictions"][0]["top"]
    p = np.zeros(len(top))
    for t in top:
        p[t["index"]] = t["probability"]
    return p


def _predict_agreement(arm: dict | None, x86: dict | None) -> str:
    a, x = _probabilities(arm), _probabilities(x86)
    if a is None or x is None:
        return f"failed on {'aarch64' if a is None else 'x86_64'}"
    same = "same top-1" if a.argmax() == x.argmax() else "top-1 differs"
    return f"{same}, max|Δp| {np.abs(a - x).max():.1e}"


# --- the steps -------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"check-arm64: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise StepError(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return r


class StepError(RuntimeError):
    pass


def export_bundles(work: Path, recipes: tuple[str, ...]) -> dict[str, str]:
    """The tiny bundle with fp32 + int8 + int8-static, one copy per int8 recipe."""
    cli = [sys.executable, "-m", "vit_deploy.cli"]
    first = work / "bundle-fp32"
    log("exporting the tiny bundle here (x86_64, PyTorch)")
    run([*cli, "export", "--model", "tiny", "--out", str(first), "--quiet"])
    bundles = {}
    for recipe in recipes:
        dst = work / f"bundle-{recipe}"
        shutil.copytree(first, dst)
        log(f"quantizing int8, int8-static (--int8-cpu {recipe}, calibration: digits)")
        run([*cli, "quantize", str(dst), "--precision", "int8,int8-static", "--calib", "digits",
             "--int8-cpu", recipe, "--quiet"])
        log(f"adding a cpu target, buckets {BUCKETS} (fp32 and int8 graphs, with their references)")
        run([*cli, "target", str(dst), "--target", "cpu", "--buckets", BUCKETS, "--quiet"])
        bundles[recipe] = dst.name
    shutil.rmtree(first)
    return bundles


def write_inputs(work: Path, classes: int, bundles: dict[str, str]) -> dict:
    from PIL import Image
    inputs = {f"{h}x{w}_b{b}": sample_inputs((h, w), b) for (h, w), b in INPUT_SIZES}
    np.savez(work / "inputs.npz", **inputs)
    rng = np.random.default_rng(26)
    Image.fromarray((rng.random((40, 56, 3)) * 255).astype(np.uint8)).save(work / "image.png")
    plan = {"bundles": bundles, "precisions": list(PRECISIONS), "inputs": "inputs.npz",
            "image": "image.png", "classes": classes}
    (work / "plan.json").write_text(json.dumps(plan, indent=2))
    return inputs


def build_wheel(work: Path) -> Path:
    log("building the vit-deploy wheel")
    dist = work / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "-w", str(dist), str(ROOT)], cwd=work)
    (wheel,) = dist.glob("vit_deploy-*.whl")
    return wheel


def base_requirements(wheel: Path) -> list[str]:
    """The wheel's own base requirements (no extras), with onnxruntime-gpu (no aarch64
    wheels) replaced by onnxruntime, pinned to the version that runs here so the two
    sides differ by CPU only."""
    import onnxruntime
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = req.split(";")[0].split("[")[0]
        for op in "<>=!~ ":
            name = name.split(op)[0]
        if name.lower() in ("onnxruntime-gpu", "onnxruntime"):
            if ";" in req and name.lower() == "onnxruntime-gpu":
                continue  # a marker chooses it elsewhere; the onnxruntime line covers aarch64
            req = f"onnxruntime=={onnxruntime.__version__.split('+')[0]}"
        reqs.append(req)
    return sorted(set(reqs))


def chroot(rootfs: Path, *cmd: str, env: Mapping[str, str] = {},
           timeout: float = 1800) -> subprocess.CompletedProcess:
    """`cmd` in the root file system, in a clean environment (no /proc, no /sys)."""
    return run(["chroot", str(rootfs), "/usr/bin/env", "-i",
                *(f"{k}={v}" for k, v in {**CHROOT_ENV, **env}.items()), *cmd], timeout=timeout)


def network_env(rootfs: Path) -> dict[str, str]:
    """What pip inside needs to reach PyPI the way this machine does: names (resolv.conf),
    this machine's certificate authorities (a proxy may re-sign TLS) and its proxies."""
    shutil.copy2("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    env = {k: v for k, v in os.environ.items()
           if k.lower() in ("http_proxy", "https_proxy", "no_proxy")}
    bundle = next((Path(os.environ[k]) for k in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
                   if os.environ.get(k) and Path(os.environ[k]).is_file()),
                  Path("/etc/ssl/certs/ca-certificates.crt"))
    if bundle.is_file():
        inside = "/etc/ssl/certs/vit-deploy-host-ca.crt"
        shutil.copy2(bundle, rootfs / inside.lstrip("/"))
        env["PIP_CERT"] = inside
    return env


def install_runtime(rootfs: Path, wheel: Path) -> dict[str, float]:
    """A virtual environment in the root file system with the base install from PyPI
    (aarch64 wheels; kept between runs while the requirements are the same), then this
    checkout's wheel."""
    times = {}
    venv = rootfs / CHROOT_VENV.lstrip("/")
    reqs = base_requirements(wheel)
    stamp = venv / ".vit-deploy-requirements"
    if not stamp.is_file() or stamp.read_text().splitlines() != reqs:
        log(f"installing the base requirements on aarch64 (~2.5 min): {' '.join(reqs)}")
        t0 = time.perf_counter()
        chroot(rootfs, "/usr/bin/python3", "-m", "venv", "--clear", CHROOT_VENV)
        chroot(rootfs, f"{CHROOT_VENV}/bin/pip", "install", "--quiet", "--only-binary=:all:", *reqs,
               env=network_env(rootfs))
        stamp.write_text("\n".join(reqs) + "\n")
        times["pip install (aarch64, emulated)"] = time.perf_counter() - t0
    inside = Path("/tmp") / wheel.name
    shutil.copy2(wheel, rootfs / inside.relative_to("/"))
    chroot(rootfs, f"{CHROOT_VENV}/bin/pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(inside))
    (rootfs / inside.relative_to("/")).unlink()
    return times


def torch_reference(work: Path, bundle: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    from vit_deploy.check.run import _torch_reference
    from vit_deploy.runtime.manifest import load_manifest
    forward = _torch_reference(work / bundle, load_manifest(work / bundle))
    return {n: np.asarray(forward(x)) for n, x in inputs.items()}


def main(argv: list[str] | None = None, *, compare: Callable[..., list[Row]] = compare_runs) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rootfs", type=Path, required=True, help="the aarch64 root file system")
    ap.add_argument("--out", type=Path, default=None, help="keep the report, outputs and logs here")
    ap.add_argument("--recipes", default=",".join(RECIPES), help="int8 recipes (--int8-cpu): any,vnni")
    args = ap.parse_args(argv)
    recipes = tuple(r for r in args.recipes.split(",") if r)
    if not recipes or set(recipes) - set(RECIPES):
        ap.error(f"--recipes: expected some of {list(RECIPES)}, got {args.recipes!r}")
    rootfs = args.rootfs.resolve()
    if not (rootfs / "usr/bin/python3").exists():
        log(f"{rootfs} holds no aarch64 Python; build it with scripts/check_arm64.sh")
        return 1
    out = args.out.resolve() if args.out else Path(tempfile.mkdtemp(prefix="vit-deploy-arm64-"))
    out.mkdir(parents=True, exist_ok=True)
    # the work directory lies inside the root file system, where both sides can read it
    work = Path(tempfile.mkdtemp(prefix="vit-deploy-check-", dir=rootfs / "tmp"))
    inside = "/" + str(work.relative_to(rootfs))
    times: dict[str, float] = {}
    try:
        bundles = export_bundles(work, recipes)
        inputs = write_inputs(work, classes=10, bundles=bundles)
        shutil.copy2(ROOT / "scripts" / "arm64_run.py", work / "arm64_run.py")  # both sides run it
        wheel = build_wheel(work)
        t0 = time.perf_counter()
        times |= install_runtime(rootfs, wheel)
        log("running `vit-deploy check --reference bundle`, the bundles and `vit-deploy predict` on aarch64 (qemu)")
        t1 = time.perf_counter()
        r = chroot(rootfs, f"{CHROOT_VENV}/bin/python", f"{inside}/arm64_run.py", inside,
                   "--name", "aarch64", "--cli", f"{CHROOT_VENV}/bin/vit-deploy")
        times["run (aarch64, emulated)"] = time.perf_counter() - t1
        (out / "aarch64.log").write_text(r.stderr)
        log("running the same on x86_64")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        r = run([sys.executable, str(work / "arm64_run.py"), str(work), "--name", "x86_64"], env=env)
        (out / "x86_64.log").write_text(r.stderr)
        log("PyTorch fp32 reference")
        reference = torch_reference(work, next(iter(bundles.values())), inputs)
        arm, x86 = dict(np.load(work / "aarch64.npz")), dict(np.load(work / "x86_64.npz"))
        arm_info = json.loads((work / "aarch64.json").read_text())
        x86_info = json.loads((work / "x86_64.json").read_text())
        rows = compare(arm, x86, reference, recipes=recipes,
                       predictions=(arm_info["predictions"], x86_info["predictions"]))
        checks, problems = check_rows({recipe: _check_report(work, "aarch64", recipe, arm_info)
                                       for recipe in recipes})
        times["total after the root file system"] = time.perf_counter() - t0
        report = Arm64Report(rows=rows, checks=checks, check_problems=problems, machine={
            "date": datetime.date.today().isoformat(),
            "host_cpu": _cpu_model(), "host_int8_kernel": x86_info["int8_kernel"],
            "aarch64": {k: arm_info[k] for k in ("machine", "python", "onnxruntime", "numpy", "int8_kernel",
                                                 "torch_importable")},
            "x86_64": {k: x86_info[k] for k in ("machine", "python", "onnxruntime", "numpy")},
            "emulator": "qemu-user-static (binfmt_misc, F)", "host": platform.platform(),
            "seconds": {k: round(v, 1) for k, v in times.items()}})
        for name in ("aarch64.npz", "x86_64.npz", "aarch64.json", "x86_64.json", "plan.json"):
            shutil.copy2(work / name, out / name)
        for report_file in work.glob("check-*.json"):  # the check reports of both sides
            shutil.copy2(report_file, out / report_file.name)
    except (StepError, subprocess.TimeoutExpired) as e:
        log(f"a step failed: {e}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if arm_info["torch_importable"]:
        log("torch is importable in the aarch64 environment: the runtime was not tested torch-free")
        report.rows = []  # fails the report
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
    (out / "report.md").write_text("## vit-deploy check --reference bundle on aarch64\n\n"
                                   + report.check_markdown()
                                   + "\n\n## aarch64 vs x86_64 vs PyTorch fp32\n\n" + report.markdown())
    from rich.console import Console
    Console(width=None if sys.stdout.isatty() else 160).print(report)  # a log keeps every column
    m = report.machine
    print(f"aarch64: Python {m['aarch64']['python']}, onnxruntime {m['aarch64']['onnxruntime']}, "
          f"int8 kernel {m['aarch64']['int8_kernel']}; host: {m['host_cpu']} ({m['host_int8_kernel']}); "
          f"times {m['seconds']}")
    print(f"check-arm64: {'PASS' if report else 'FAIL'}; report in {out}")
    return 0 if report else 1


def _check_report(work: Path, side: str, recipe: str, info: dict) -> dict | None:
    """The `check --json` report one side wrote for one recipe's bundle (None if none)."""
    name = (info.get("checks") or {}).get(recipe, {}).get("report")
    if not name:
        log(f"{side}: no check report for {recipe}:\n{(info.get('checks') or {}).get(recipe, {}).get('output', '')}")
        return None
    return json.loads((work / name).read_text())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
