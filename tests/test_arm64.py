"""`make check-arm64` (scripts/check_arm64.sh + check_arm64.py): where the aarch64 root file
system cannot be built or run it refuses, loudly and with a non-zero exit, before building
anything; and its comparison judges by the tolerance policy. Nothing here builds the root
file system or runs qemu (that is `make check-arm64` itself)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_arm64.sh"
ROOT_USER = os.geteuid() == 0


def _driver():
    """scripts/check_arm64.py as a module (scripts/ is not a package)."""
    if "check_arm64" not in sys.modules:
        spec = importlib.util.spec_from_file_location("check_arm64", ROOT / "scripts" / "check_arm64.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["check_arm64"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules["check_arm64"]


def _binfmt(tmp_path: Path, flags: str | None) -> Path:
    """A stand-in binfmt_misc directory: mounted, with an aarch64 entry of these flags."""
    d = tmp_path / "binfmt"
    d.mkdir()
    (d / "register").write_text("")
    if flags is not None:
        (d / "qemu-aarch64").write_text(f"enabled\ninterpreter /usr/bin/qemu-aarch64-static\n"
                                        f"flags: {flags}\noffset 0\n")
    return d


def _tools(tmp_path: Path, *names: str) -> Path:
    """A tool path holding only these commands (stubs that fail if ever run)."""
    d = tmp_path / "tools"
    d.mkdir()
    for name in names:
        (d / name).write_text("#!/bin/sh\necho \"stub $0 must not run\" >&2\nexit 99\n")
        (d / name).chmod(0o755)
    return d


def _refused(tmp_path: Path, *, binfmt: Path, tools: Path | None = None, user: list[str] = ()):
    rootfs = tmp_path / "cache" / "arm64-rootfs"
    env = {**os.environ, "VIT_DEPLOY_ARM64_ROOTFS": str(rootfs),
           "VIT_DEPLOY_ARM64_BINFMT": str(binfmt), "BIN": "/nonexistent"}
    if tools is not None:
        env["VIT_DEPLOY_ARM64_TOOLS_PATH"] = str(tools)
    r = subprocess.run([*user, "bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "check-arm64: cannot run here:" in r.stderr
    assert "this is a failure, not a pass" in r.stderr
    assert not rootfs.exists() and not rootfs.with_name("arm64-rootfs.partial").exists()
    return r.stderr


def _needs_root(stderr: str) -> bool:
    return "needs root" in stderr


def test_refuses_without_binfmt_misc(tmp_path):
    err = _refused(tmp_path, binfmt=tmp_path / "no-binfmt")
    assert ("binfmt_misc is not mounted" in err) if ROOT_USER else _needs_root(err)


def test_refuses_without_an_aarch64_interpreter(tmp_path):
    err = _refused(tmp_path, binfmt=_binfmt(tmp_path, flags=None))
    assert ("no aarch64 interpreter is registered" in err) if ROOT_USER else _needs_root(err)


def test_refuses_an_interpreter_without_the_fix_binary_flag(tmp_path):
    # Debian's qemu-user-binfmt registers "OP": the interpreter is not found inside a chroot
    err = _refused(tmp_path, binfmt=_binfmt(tmp_path, flags="OP"))
    assert ("without the F flag (flags: 'OP')" in err) if ROOT_USER else _needs_root(err)


def test_refuses_to_build_without_debootstrap(tmp_path):
    err = _refused(tmp_path, binfmt=_binfmt(tmp_path, flags="PF"), tools=_tools(tmp_path, "chroot"))
    assert ("no debootstrap to build one" in err) if ROOT_USER else _needs_root(err)


def test_refuses_without_root(tmp_path):
    user = []
    if ROOT_USER:  # drop to nobody for the run
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to run this test as root"
        user = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        tmp_path.chmod(0o777)
    err = _refused(tmp_path, binfmt=_binfmt(tmp_path, flags="PF"), user=user)
    assert _needs_root(err)


def test_make_has_the_target():
    text = (ROOT / "Makefile").read_text()
    assert "check-arm64:" in text and "scripts/check_arm64.sh" in text


# --- the comparison -------------------------------------------------------------------


def _runs(noise: dict[str, float]):
    """PyTorch logits and x86 / aarch64 outputs off them by `noise` per precision."""
    rng = np.random.default_rng(0)
    ref = {"32x32_b4": rng.standard_normal((4, 10)).astype(np.float32)}
    x86, arm = {}, {}
    for precision in ("fp32", "int8", "int8-static"):
        for name, r in ref.items():
            x86[f"any/{precision}/{name}"] = r + noise[precision] * rng.standard_normal(r.shape).astype(np.float32)
            arm[f"any/{precision}/{name}"] = r + noise[precision] * rng.standard_normal(r.shape).astype(np.float32)
    ok = {"returncode": 0, "result": {"predictions": [{"top": [
        {"index": i, "probability": p} for i, p in enumerate(np.full(10, 0.1))]}]}}
    preds = {f"any/{p}": ok for p in ("fp32", "int8", "int8-static")}
    return arm, x86, ref, preds


def test_the_comparison_passes_within_policy():
    d = _driver()
    arm, x86, ref, preds = _runs({"fp32": 1e-7, "int8": 1e-2, "int8-static": 1e-2})
    rows = d.compare_runs(arm, x86, ref, predictions=(preds, preds), recipes=("any",))
    assert [(r.precision, r.recipe) for r in rows] == [("fp32", "-"), ("int8", "any"), ("int8-static", "any")]
    assert all(r.passed for r in rows), rows
    report = d.Arm64Report(rows=rows)
    assert "| fp32 | - |" in report.markdown()
    assert rows[0].predict == "same top-1, max|Δp| 0.0e+00"


def test_the_comparison_fails_outside_policy_and_when_predict_failed():
    d = _driver()
    arm, x86, ref, preds = _runs({"fp32": 1e-3, "int8": 1e-2, "int8-static": 0.5})
    broken = {**preds, "any/int8": {"returncode": 1, "result": None}}
    rows = {r.precision: r for r in d.compare_runs(arm, x86, ref, predictions=(broken, preds),
                                                   recipes=("any",))}
    assert not rows["fp32"].passed and not rows["fp32"].vs_x86.passed  # 1e-3 > fp32 tolerance
    assert not rows["int8"].passed and rows["int8"].predict == "failed on aarch64"
    assert not rows["int8-static"].passed and rows["int8-static"].vs_torch.cosine < 0.99
    assert not d.Arm64Report(rows=list(rows.values()))
    assert not d.Arm64Report(rows=[])  # nothing compared is not a pass


# --- the table of `vit-deploy check --reference bundle` reports -----------------------


def _check_report(recipe_cos: float, *, passed: bool = True, checks_pass: bool = True) -> dict:
    """A synthetic `check --json` report (shared schema) of a bundle with a cpu target."""
    def case(precision, label, provider, cos, max_abs):
        ok = cos >= (0.99999 if precision == "fp32" else 0.99)
        return {"label": label, "provider": provider, "precision": precision, "resolution": [32, 32],
                "batch": 2, "output": "logits", "max_abs": max_abs, "cosine": cos, "passed": ok}
    cases = [case("fp32", "32x32 b2", "cpu", 1.0, 1e-7), case("fp32", "48x64 b2", "cpu (bucket cpu)", 1.0, 2e-7),
             case("int8", "32x32 b2", "cpu", recipe_cos, 4e-3),
             case("int8", "48x64 b2", "cpu (bucket cpu)", recipe_cos, 5e-3),
             case("int8-static", "32x32 b2", "cpu", 0.9995, 6e-3)]
    return {"schema": "vit-deploy-report", "schema_version": 1, "kind": "check",
            "passed": passed and all(c["passed"] for c in cases) and checks_pass, "cases": cases,
            "checks": [{"name": "determinism", "subject": "cpu:int8", "passed": checks_pass}]}


def test_the_check_table_reads_the_reports():
    d = _driver()
    rows, problems = d.check_rows({"any": _check_report(0.9996), "vnni": _check_report(0.9998)})
    assert problems == []
    # fp32 is one file in both bundles: once, recipe "-"; int8 per recipe; buckets after cpu
    assert [(r.precision, r.recipe, r.provider) for r in rows] == [
        ("fp32", "-", "cpu"), ("fp32", "-", "cpu (bucket cpu)"),
        ("int8", "any", "cpu"), ("int8", "any", "cpu (bucket cpu)"),
        ("int8", "vnni", "cpu"), ("int8", "vnni", "cpu (bucket cpu)"),
        ("int8-static", "any", "cpu"), ("int8-static", "vnni", "cpu")]
    report = d.Arm64Report(rows=_good_rows(d), checks=rows)
    assert report
    md = report.check_markdown()
    assert "| int8 | vnni | 48x64 b2 | cpu (bucket cpu) | 5.0e-03 | 0.999800 | pass |" in md
    assert report.to_dict()["check"]["rows"][0]["case"] == "32x32 b2"
    from rich.console import Console
    console = Console(width=200, record=True)
    console.print(report)
    assert "cpu (bucket cpu)" in console.export_text()  # both tables reach the terminal


def test_the_check_table_fails_a_failed_or_missing_report():
    d = _driver()
    rows, problems = d.check_rows({"any": _check_report(0.95), "vnni": None})
    assert [r.passed for r in rows if r.precision == "int8"] == [False, False]
    assert problems == ["any: the check failed", "vnni: the check wrote no report"]
    good = _good_rows(d)
    assert not d.Arm64Report(rows=good, checks=rows, check_problems=problems)
    # every case within policy, but the report failed as a whole (determinism): not a pass
    rows, problems = d.check_rows({"any": _check_report(0.9996, checks_pass=False)})
    assert all(r.passed for r in rows) and problems == ["any: the check failed (determinism cpu:int8)"]
    assert not d.Arm64Report(rows=good, checks=rows, check_problems=problems)
    assert "FAIL: any: the check failed" in d.Arm64Report(checks=rows, check_problems=problems).check_markdown()
    assert not d.Arm64Report(rows=good)  # no check run on aarch64 is not a pass


def _good_rows(d):
    arm, x86, ref, preds = _runs({"fp32": 1e-7, "int8": 1e-2, "int8-static": 1e-2})
    return d.compare_runs(arm, x86, ref, predictions=(preds, preds), recipes=("any",))
