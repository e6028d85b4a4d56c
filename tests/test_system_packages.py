"""scripts/system_packages.sh: the Debian packages a make target needs, installed in one
apt-get call where that can be done, named where it cannot; and the Makefile's targets
that need packages depend on it (make test and make check-arm64 set up what they run)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "system_packages.sh"


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _run(tmp_path: Path, uid: int, present: list[str], *pairs: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "apt.log"
    _stub(bin_dir, "id", f"echo {uid}")
    _stub(bin_dir, "apt-get", f'echo "$*" >> {log}')
    for name in present:
        _stub(bin_dir, name, "true")
    # only the stubs and what bash itself needs: the real commands must not count as present
    env = {"PATH": f"{bin_dir}:/usr/bin/env-none", "HOME": str(tmp_path)}
    r = subprocess.run(["/bin/bash", str(SCRIPT), "make x", *pairs], env=env,
                       capture_output=True, text=True, timeout=30)
    return r, (log.read_text() if log.exists() else "")


def test_nothing_is_installed_when_every_command_is_there(tmp_path):
    r, apt = _run(tmp_path, 0, ["qemu-aarch64-static", "debootstrap"],
                  "qemu-aarch64-static:qemu-user-static", "debootstrap:debootstrap")
    assert r.returncode == 0 and apt == "" and r.stderr == ""


def test_the_missing_packages_are_installed_in_one_call_as_root(tmp_path):
    # command names no machine has (the script also looks in /usr/sbin and /sbin)
    r, apt = _run(tmp_path, 0, ["vd-here"], "vd-absent-a:pkg-a", "vd-here:pkg-here",
                  "vd-absent-b:pkg-b")
    assert r.returncode == 0, r.stderr
    assert apt.splitlines() == ["update -qq", "install -y -qq pkg-a pkg-b"]
    assert "installing Debian packages: pkg-a pkg-b" in r.stderr


def test_without_root_it_names_what_is_missing_and_installs_nothing(tmp_path):
    r, apt = _run(tmp_path, 1000, [], "vd-absent:pkg-absent")
    assert r.returncode == 0 and apt == ""
    assert "make x needs pkg-absent, which cannot be installed here" in r.stderr


def _prerequisites(makefile: str, target: str) -> list[str]:
    line = re.search(rf"^{re.escape(target)}:(.*)$", makefile, re.M).group(1)
    return line.split("|")[0].split()


def test_make_test_and_check_arm64_install_what_they_run():
    makefile = (ROOT / "Makefile").read_text()
    stamps = dict(re.findall(r"^(\w+_STAMP) := (\S+)$", makefile, re.M))
    recipes = {}
    for name in stamps:
        m = re.search(rf"^\$\({name}\):.*\n((?:\t.*\n)+)", makefile, re.M)
        recipes[name] = m.group(1).replace("\\\n", " ") if m else ""
    needs = {"test": ["chromium:chromium", "qemu-x86_64:qemu-user", "strace:strace",
                      "unshare:util-linux", "ip:iproute2"],
             "check-arm64": ["qemu-aarch64-static:qemu-user-static",
                             "update-binfmts:binfmt-support", "debootstrap:debootstrap"]}
    for target, pairs in needs.items():
        installs = " ".join(recipes[name] for name in stamps
                            if f"$({name})" in _prerequisites(makefile, target))
        assert "scripts/system_packages.sh" in installs, target
        for pair in pairs:
            assert pair in installs, (target, pair)
    assert os.access(SCRIPT, os.X_OK)
