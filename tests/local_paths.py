"""What a published bundle must not carry: the paths of the machine it was exported on."""

from __future__ import annotations

from pathlib import Path


def assert_names_no_local_path(bundle: Path, *places: Path) -> None:
    """No file of `bundle` holds any of `places` (as given or resolved), nor this checkout's
    own folder (the exporter's stack traces name vit_deploy's source files)."""
    import vit_deploy

    needles = {str(p) for place in places for p in (Path(place), Path(place).resolve())}
    needles.add(str(Path(vit_deploy.__file__).resolve().parent.parent))
    needles = {n.encode() for n in needles if len(n) > 1}
    for f in sorted(Path(bundle).rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            found = [n.decode() for n in needles if n in data]
            assert not found, f"{f.relative_to(bundle)} names local path(s) {found}"
