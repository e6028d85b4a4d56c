"""What `embed` reads and writes before and after Ray runs (ray/shards.py, ray/embed.py),
without a cluster: only regular image files are read (a FIFO blocks its reader, /dev/zero
never ends), --out is never one of the images, the shard folder beside --out is used only
when vit-deploy made it (a user's folder there is never written into or removed), a
replaced image is computed again (not its old row), and a job that fails before its first
shard leaves nothing behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from vit_deploy.ray import embed as embed_module
from vit_deploy.ray.shards import PARTS_MARK, collect_paths, own_parts_dir, parts_dir, plan, stamps


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    paths = []
    for i in range(3):
        paths.append(folder / f"{i}.png")
        Image.fromarray(rng.integers(0, 255, (40, 50, 3), np.uint8)).save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, make_tiny):
    from vit_deploy.export.bundle import ExportOptions, export_bundle

    out = tmp_path_factory.mktemp("embed") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(resolution=(32, 32), simplify=False))
    return out


@pytest.mark.parametrize("kind", ["fifo", "device", "fifo listed", "device listed"])
def test_only_regular_files_are_read(tmp_path, photos, kind):
    odd = tmp_path / "pipe"
    if kind.startswith("fifo"):
        os.mkfifo(odd)
    else:
        odd.symlink_to("/dev/zero")
    item = odd
    if kind.endswith("listed"):
        item = tmp_path / "list.txt"
        item.write_text(f"{photos[0]}\n{odd}\n")
    start = time.monotonic()
    with pytest.raises(ValueError, match="a FIFO|a character device"):
        collect_paths([photos[0].parent, item])
    assert time.monotonic() - start < 5  # refused unopened


def test_a_replaced_image_gets_a_new_shard(photos):
    paths = [str(p) for p in photos]
    before = plan(paths, job="j", shard_size=2, files=stamps(paths))
    assert before == plan(paths, job="j", shard_size=2, files=stamps(paths))
    Image.new("RGB", (40, 50), "red").save(photos[2])  # same path, other pixels
    os.utime(photos[2], ns=(1, 1))
    after = plan(paths, job="j", shard_size=2, files=stamps(paths))
    assert before[0] == after[0] and before[1].name != after[1].name


def test_the_shard_folder_is_ours_or_refused(tmp_path):
    out = tmp_path / "features.parquet"
    folder = own_parts_dir(out)
    assert folder == parts_dir(out) and (folder / PARTS_MARK).is_file()
    assert own_parts_dir(out) == folder  # found ours again (a rerun after a kill)


@pytest.mark.parametrize("what", ["user folder", "symlink", "file", "marked symlink"])
def test_what_is_not_ours_at_the_shard_folder_is_never_touched(tmp_path, what):
    out = tmp_path / "features.parquet"
    there, elsewhere = parts_dir(out), tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "thesis.txt").write_text("mine")
    if what == "user folder":
        there.mkdir()
        (there / "notes.txt").write_text("mine")
    elif what == "file":
        there.write_text("mine")
    else:
        if what == "marked symlink":
            (elsewhere / PARTS_MARK).write_text("x")
        there.symlink_to(elsewhere)
    with pytest.raises(ValueError, match="move it away"):
        own_parts_dir(out)
    assert (elsewhere / "thesis.txt").read_text() == "mine"
    if what == "user folder":
        assert sorted(p.name for p in there.iterdir()) == ["notes.txt"]


def test_out_is_never_one_of_the_images(bundle, photos):
    """`--out` naming an input image (directly, or listed) is refused, --force or not."""
    listing = photos[0].parent / "list.txt"
    listing.write_text(f"{photos[1]}\n")
    for images, out in ([photos[0].parent], photos[0]), ([listing], photos[1]):
        from vit_deploy.cli import main

        before = out.read_bytes()
        r = CliRunner().invoke(main, ["embed", str(bundle), *map(str, images), "--out", str(out),
                                      "--force"])
        assert r.exit_code == 2 and "is one of the images to embed" in r.output, r.output
        assert out.read_bytes() == before


def test_a_job_that_fails_before_its_first_shard_leaves_nothing(bundle, photos, tmp_path,
                                                                 monkeypatch):
    def no_cluster(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(embed_module, "_run_here", no_cluster)  # the default: in this process
    out = tmp_path / "features.parquet"
    with pytest.raises(OSError):
        embed_module.embed(bundle, [photos[0].parent], out)
    assert not parts_dir(out).exists() and not out.exists()
    # a shard already written (a killed run's) stays for the rerun
    folder = own_parts_dir(out)
    (folder / "part-00000-0123456789abcdef.parquet").write_bytes(b"")
    with pytest.raises(OSError):
        embed_module.embed(bundle, [photos[0].parent], out)
    assert (folder / "part-00000-0123456789abcdef.parquet").exists()


def test_a_second_job_on_one_output_stops_at_once_naming_the_first(bundle, photos, tmp_path):
    """Two embeds writing one --out shared its shard folder; now the second fails at once,
    exit 1, naming the writer that holds the output (the same lock as bundles')."""
    import subprocess
    import sys

    from vit_deploy.runtime.swap import writer_lock

    out = tmp_path / "features.parquet"
    with writer_lock(out):  # this process is the first job
        r = subprocess.run([sys.executable, "-m", "vit_deploy.cli", "embed", str(bundle),
                            str(photos[0].parent), "--out", str(out), "--quiet"],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr[-1500:]
    assert f"is being written by vit-deploy (pid {os.getpid()})" in r.stderr, r.stderr[-1500:]
    assert not out.exists() and not parts_dir(out).exists()


def test_embed_runs_in_this_process_without_ray(bundle, photos, tmp_path):
    """The default: no Ray (its import blocked here), one Parquet row per image with the
    runtime's own logits and classes, a bad image a row with its error; --actors without
    --ray is refused."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from vit_deploy.runtime import ViTSession

    (photos[0].parent / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "features.parquet"
    code = ("import sys; sys.modules['ray'] = None; from vit_deploy.cli import main; "
            "main(sys.argv[1:])")
    args = [sys.executable, "-c", code, "embed", str(bundle), str(photos[0].parent), "--out",
            str(out), "--shard-size", "2", "--batch", "2"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "embedding: 2/2 shard(s) written, 4 image(s), 1 bad" in r.stderr, r.stderr
    table = pq.read_table(out).to_pylist()
    assert [Path(row["path"]).name for row in table] == ["0.png", "1.png", "2.png", "broken.png"]
    assert table[3]["error"] and table[3]["logits"] is None
    with ViTSession(bundle) as s:
        x = np.stack([s.preprocess()(p) for p in photos])
        want = s.run_all(x)
    assert [row["top_k_index"][0] for row in table[:3]] == list(want["logits"].argmax(1))
    np.testing.assert_allclose([row["logits"] for row in table[:3]], want["logits"], rtol=1e-5,
                               atol=1e-6)
    r = subprocess.run([*args, "--force", "--actors", "2"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "give --ray" in r.stderr, r.stderr[-800:]
