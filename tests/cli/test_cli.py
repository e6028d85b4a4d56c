import json

import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.runtime.contract import MANIFEST_NAME


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_export_and_info(tmp_path):
    out = tmp_path / "bundle"
    r = run("export", "--model", "tiny", "--res", "24x40", "--pos-embed", "factorized",
            "--pool", "mean", "--num-classes", "5", "--out", out)
    assert r.exit_code == 0, r.output
    assert "parity: PASS" in r.output and "model.onnx" in r.output
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["config"]["num_classes"] == 5 and manifest["config"]["pool"] == "mean"

    r = run("info", out)
    assert r.exit_code == 0 and "tiny/8" in r.output and "height and width are positive " \
                                                           "multiples of 8" in r.output
    r = run("info", out, "--json")
    assert json.loads(r.output)["config"] == manifest["config"]


def test_static_export_via_cli(tmp_path):
    r = run("export", "--model", "tiny", "--res", "16", "--static", "--no-simplify",
            "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert "(static)" in r.output and "onnxsim" not in r.output


# What each refusal must say, in our words or click's: the option, the value given and
# what was expected (click's own phrasing is not pinned: any words that name these pass).
@pytest.mark.parametrize("args,parts", [
    (["--res", "30"], ["input height 30 is not a positive multiple of the patch size 8; "
                       "nearest valid sizes: 24 or 32"]),
    (["--res", "0"], ["resolution must be positive"]),
    (["--res", "abc"], ["resolution must be N or HxW"]),
    (["--res", "32x"], ["resolution must be N or HxW"]),
    (["--model", "XL"], ["unknown model variant 'XL'"]),
    (["--pos-embed", "sinusoidal"], ["--pos-embed", "'sinusoidal'", "learned", "factorized"]),
    (["--patch", "0"], ["--patch", "0", "1", "1024"]),
    (["--patch", "5"], ["img_size (32, 32) must be positive multiples of patch_size 5"]),
    (["--opset", "17"], ["--opset", "17", "18", "30"]),
    (["--checkpoint", "/nonexistent.safetensors"], ["/nonexistent.safetensors' does not exist"]),
])
def test_bad_arguments_exit_2_with_a_message_and_write_nothing(tmp_path, args, parts):
    out = tmp_path / "b"
    r = run("export", "--model", "tiny", *args, "--out", out)
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert all(part in text for part in parts), (parts, text)
    assert "Traceback" not in r.output
    assert not out.exists()


def test_refuses_to_overwrite_a_directory_that_is_not_a_bundle(tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "data.txt").write_text("x")
    r = run("export", "--model", "tiny", "--out", out)
    assert r.exit_code == 2 and "--force" in r.output
    assert [p.name for p in out.iterdir()] == ["data.txt"]


def test_checkpoint_round_trip(tmp_path, make_tiny):
    from vit_deploy.export.checkpoints import save_weights

    path = save_weights(make_tiny("factorized", "mean", num_classes=4), tmp_path / "w.safetensors")
    r = run("export", "--model", "tiny", "--checkpoint", path, "--out", tmp_path / "b",
            "--no-simplify")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "b" / MANIFEST_NAME).read_text())["config"]
    assert (cfg["pos_embed"], cfg["num_classes"]) == ("factorized", 4)


def test_checkpoint_with_wrong_layout_lists_keys(tmp_path):
    import torch

    path = tmp_path / "w.pt"
    torch.save({"blocks.0.attn.in_proj_weight": torch.zeros(3)}, path)
    r = run("export", "--model", "tiny", "--checkpoint", path, "--out", tmp_path / "b")
    assert r.exit_code == 2
    assert "missing keys" in r.output and "unexpected keys" in r.output
    assert "in_proj_weight" in r.output


def test_pickle_that_runs_code_is_refused(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps({"x": Evil()}))
    r = run("export", "--model", "tiny", "--checkpoint", path, "--out", tmp_path / "b")
    assert r.exit_code == 2 and "weights_only" in r.output
    assert "pwned" not in r.output


def test_info_on_something_that_is_not_a_bundle(tmp_path):
    r = run("info", tmp_path)
    assert r.exit_code == 2 and "not a vit-deploy bundle" in r.output


def test_predict_and_providers(tmp_path):
    import numpy as np
    from PIL import Image

    out = tmp_path / "b"
    assert run("export", "--model", "tiny", "--no-simplify", "--out", out).exit_code == 0
    image = tmp_path / "a.png"
    Image.fromarray(np.full((20, 30, 3), 90, np.uint8)).save(image)
    r = run("predict", out, image, "--top-k", "2", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["providers"] == ["cpu"] and len(data["predictions"][0]["top"]) == 2
    r = run("predict", out, image, "--resize", "patch_multiple", "--res", "64")
    assert r.exit_code == 0 and "ran on cpu" in r.output and "(64x96)" in r.output

    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"nope")
    r = run("predict", out, bad)
    assert r.exit_code == 2 and "not an image" in r.output and "Traceback" not in r.output
    r = run("predict", out, image, "--provider", "warp-drive")
    assert r.exit_code == 2 and "unknown provider 'warp-drive'" in r.output

    r = run("providers", "--json")
    assert r.exit_code == 0
    listed = {p["alias"]: p for p in json.loads(r.output)["providers"]}
    assert listed["cpu"]["usable"] is True
    for p in listed.values():
        assert p["usable"] or p["reason"]  # an unusable provider always says why


@pytest.mark.parametrize("given", ["S", "B/16", "Ti", "L/14"])
def test_a_model_size_that_contradicts_the_checkpoint_is_an_error(tmp_path, make_tiny, given):
    """`--model` beside a `--checkpoint` is never ignored: another size is refused, naming
    both shapes, and nothing is written."""
    from vit_deploy.export.checkpoints import save_weights

    path = save_weights(make_tiny(), tmp_path / "w.safetensors")
    r = run("export", "--model", given, "--checkpoint", path, "--out", tmp_path / "b")
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert f"--model {given} (width" in text and "contradicts the checkpoint (width 48" in text
    assert "Traceback" not in r.output and not (tmp_path / "b").exists()


@pytest.mark.parametrize("instances", ["cpu:2147483648", "cpu:257", "cpu:0", "gpu:-1", "cpu:²",
                                       "cpu:1e3", "tpu:1", "cpu:" + "9" * 50, "cpu", ","])
def test_triton_instances_outside_what_triton_reads_are_refused(quantised_bundle, tmp_path,
                                                                instances):
    r = run("triton", quantised_bundle, "--out", tmp_path / "repo", "--instances", instances)
    assert r.exit_code == 2, r.output
    assert "instance" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "repo").exists()


def test_triton_instances_at_the_bound_are_written(quantised_bundle, tmp_path):
    r = run("triton", quantised_bundle, "--out", tmp_path / "repo", "--instances", "cpu:256,gpu:1")
    assert r.exit_code == 0, r.output
    (config,) = (tmp_path / "repo").rglob("config.pbtxt")
    assert "count: 256" in config.read_text()


def test_sites_and_repositories_say_what_they_are_and_keep_the_users_paths_home(
        quantised_bundle, tmp_path):
    """A web site is served to anyone: its manifest names the bundle, not the folders it
    lives in; a Triton repository and a site each say which they are."""
    from vit_deploy.atomic import is_bundle
    from vit_deploy.website.site import write_site

    write_site(quantised_bundle, tmp_path / "site")
    r = run("triton", quantised_bundle, "--out", tmp_path / "repo")
    assert r.exit_code == 0, r.output
    for out, kind in ((tmp_path / "site", "vit-deploy-web-site"),
                      (tmp_path / "repo", "vit-deploy-triton-repository")):
        text = (out / MANIFEST_NAME).read_text()
        record = json.loads(text)
        assert record["format"] == kind and record["source_bundle"] == quantised_bundle.name
        assert str(quantised_bundle.parent) not in text
        assert is_bundle(out)  # ours: rewritten without --force
