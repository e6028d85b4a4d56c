"""Checkpoints named on the hub (hf:ORG/NAME[@REV], timm:NAME[@REV]), resolved offline.

No test touches a network: each builds a Hugging Face hub cache in a temporary directory, in
the layout huggingface_hub reads (models--ORG--NAME/{blobs, snapshots/<commit>/, refs/}: the
folder name from the library's own repo_folder_name, the layout checked with its own
scan_cache_dir), and runs with HF_HUB_OFFLINE=1 and HF_HUB_CACHE pointing at it. The models
are random-weight transformers models saved with save_pretrained (ViT, DeiT, DINOv2) and a
timm-layout state dict with timm's config.json written by hand.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from huggingface_hub import scan_cache_dir
from safetensors.torch import save_file

import transformers
from hub_cache import COMMIT_A, COMMIT_B, write_repo
from local_paths import assert_names_no_local_path
from vit_deploy.cli import main
from vit_deploy.export.hub import HubError, parse_hub_name, resolve_hub
from vit_deploy.export.model import build_model
from vit_deploy.export.sources import crop_pct_for, open_checkpoint
from vit_deploy.runtime.config import variant
from vit_deploy.runtime.manifest import load_manifest

SMALL = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, image_size=32,
             patch_size=8)
NAMES = ("tench", "goldfish", "great white shark", "tiger shark", "hammerhead")


def saved(obj) -> dict[str, bytes]:
    """What save_pretrained writes, as {file name: bytes}."""
    with tempfile.TemporaryDirectory() as d:
        obj.save_pretrained(d)
        return {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}


@pytest.fixture()
def offline(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def _vit_files(**config) -> dict[str, bytes]:
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(**SMALL, intermediate_size=192, num_labels=5, **config)
    model = transformers.ViTForImageClassification(cfg).eval()
    processor = transformers.ViTImageProcessorPil(size={"height": 32, "width": 32},
                                                  image_mean=[0.5, 0.4, 0.3],
                                                  image_std=[0.2, 0.25, 0.3])
    return saved(model) | saved(processor)


def _timm_files(*, label_names=None, num_classes=7, **pretrained) -> dict[str, bytes]:
    cfg = variant("tiny", num_classes=num_classes, pos_antialias=True)
    model = build_model(cfg, seed=3)
    state = {("pos_embed" if k == "pos.pos_embed" else k): v.contiguous()
             for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as d:
        save_file(state, f"{d}/model.safetensors")
        weights = Path(d, "model.safetensors").read_bytes()
    config = {"architecture": "vit_tiny_test", "num_classes": num_classes, "num_features": 48,
              "global_pool": "token",
              "pretrained_cfg": {"input_size": [3, 32, 32], "interpolation": "bicubic",
                                 "crop_pct": 0.9, "crop_mode": "center",
                                 "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                                 "num_classes": num_classes, **pretrained}}
    if label_names is not None:
        config["label_names"] = label_names
    return {"config.json": json.dumps(config).encode(), "model.safetensors": weights}


def test_the_cache_is_laid_out_as_huggingface_hub_reads_it(offline):
    write_repo(offline, "org/vit", _vit_files(), commit=COMMIT_A, refs=("main", "v1"))
    info = scan_cache_dir(offline)
    assert not info.warnings, info.warnings
    (repo,) = info.repos
    (revision,) = repo.revisions
    assert (repo.repo_id, revision.commit_hash, revision.refs) == ("org/vit", COMMIT_A,
                                                                   {"main", "v1"})
    assert {f.file_name for f in revision.files} == {"config.json", "model.safetensors",
                                                     "preprocessor_config.json"}


def test_hf_name_exports_with_its_preprocessing_labels_and_commit(offline, tmp_path):
    names = {str(i): n for i, n in enumerate(NAMES)}
    write_repo(offline, "org/vit", _vit_files(id2label=names,
                                              label2id={n: i for i, n in enumerate(NAMES)}),
               commit=COMMIT_A)
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", "--checkpoint", "hf:org/vit", "--out", str(out),
                                  "--no-simplify", "--quiet"])
    assert r.exit_code == 0, r.output
    m = load_manifest(out)
    assert m.labels == NAMES
    p = m.preprocess
    assert (p.resize, p.interpolation, p.crop_pct, p.resolution) == ("squash", "bilinear", None,
                                                                     (32, 32))
    assert (p.mean, p.std) == ((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    hub = m.export["source"]["hub"]
    assert (hub["checkpoint"], hub["repo_id"], hub["commit"], hub["revision"]) == (
        "hf:org/vit", "org/vit", COMMIT_A, "main")
    assert m.export["source"]["labels_from"] == "config.json (id2label)"
    assert_names_no_local_path(out, offline, tmp_path)


@pytest.mark.parametrize("name,build,processor,expect", [
    ("deit", lambda: transformers.DeiTForImageClassificationWithTeacher(
        transformers.DeiTConfig(**SMALL, intermediate_size=192, num_labels=4)),
     lambda: transformers.DeiTImageProcessorPil(size={"height": 40, "width": 40},
                                                crop_size={"height": 32, "width": 32}),
     ("squash", "bicubic", 0.8)),
    ("dinov2", lambda: transformers.Dinov2Model(transformers.Dinov2Config(**SMALL, mlp_ratio=4)),
     lambda: transformers.BitImageProcessorPil(size={"shortest_edge": 36},
                                               crop_size={"height": 32, "width": 32}),
     ("shorter_side_center_crop", "bicubic", 32 / 36)),
])
def test_other_families_resolve_with_their_processors(offline, name, build, processor, expect):
    torch.manual_seed(0)
    write_repo(offline, f"org/{name}", saved(build().eval()) | saved(processor()),
               commit=COMMIT_B)
    src = open_checkpoint(f"hf:org/{name}@main")
    assert src.source == "hf" and src.path.name == COMMIT_B
    pre = src.preprocess
    assert (pre.resize, pre.interpolation, pre.size) == (*expect[:2], (32, 32))
    assert pre.crop_pct == pytest.approx(expect[2], abs=1e-15)
    assert src.labels is None  # LABEL_0.. placeholders (deit) or no head (dinov2)
    assert src.record["hub"]["commit"] == COMMIT_B


def test_revisions_pin_a_commit(offline):
    old = write_repo(offline, "org/vit", _vit_files(), commit=COMMIT_A, refs=("v1",))
    new = write_repo(offline, "org/vit", _vit_files(layer_norm_eps=1e-6), commit=COMMIT_B)
    assert resolve_hub("hf:org/vit").commit == COMMIT_B
    assert resolve_hub("hf:org/vit@main").snapshot == new
    assert resolve_hub("hf:org/vit@v1").snapshot == old
    assert resolve_hub(f"hf:org/vit@{COMMIT_A}").commit == COMMIT_A


def test_timm_name_exports_with_pretrained_cfg_and_label_names(offline, tmp_path):
    labels = [f"class {i}" for i in range(7)]
    write_repo(offline, "timm/vit_tiny_test.in1k", _timm_files(label_names=labels),
               commit=COMMIT_A)
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", "--checkpoint", "timm:vit_tiny_test.in1k",
                                  "--heads", "3",
                                  "--out", str(out), "--no-simplify", "--quiet"])
    assert r.exit_code == 0, r.output
    m = load_manifest(out)
    p = m.preprocess
    assert (p.resize, p.interpolation, p.crop_pct, p.resolution) == (
        "shorter_side_center_crop", "bicubic", 0.9, (32, 32))
    assert p.mean == (0.485, 0.456, 0.406) and m.config.mean == p.mean
    assert m.labels == tuple(labels)
    assert m.export["source"]["hub"]["repo_id"] == "timm/vit_tiny_test.in1k"
    assert m.export["source"]["hub"]["commit"] == COMMIT_A


def test_timm_label_names_as_a_mapping_and_of_the_wrong_count(offline):
    write_repo(offline, "timm/a", _timm_files(label_names={str(i): f"n{i}" for i in range(7)}),
               commit=COMMIT_A)
    assert open_checkpoint("timm:a").labels_for(7) == tuple(f"n{i}" for i in range(7))
    write_repo(offline, "timm/b", _timm_files(label_names=["x", "y"]), commit=COMMIT_A)
    src = open_checkpoint("timm:b")
    assert src.labels_for(7) is None
    assert "2 class names" in src.manifest_record(7)["notes"][0]


@pytest.mark.parametrize("args,message", [
    (["hf:vit"], "expected hf:ORG/NAME[@REVISION] (one '/'), got 'vit'"),
    (["hf:org/vit@"], "is not a hub name: expected hf:ORG/NAME[@REVISION] or timm:NAME"),
    (["timm:org/vit"], "expected timm:NAME[@REVISION], a timm model name without '/'"),
    (["hf:org/bad name"], "is not a hub name"),
    (["hf:org/--x"], "is not a valid hub repository id"),
    (["hf:org/absent"], "the cache {cache} has no 'org/absent'"),
    (["hf:org/vit@v9"], "the cache has no revision 'v9' of it; it has refs ['main'] and "
                        "snapshots ['aaaaaaaaaaaa']"),
    (["hf:org/vit", "--from", "timm"], "--from timm contradicts the checkpoint 'hf:org/vit'"),
])
def test_bad_names_and_missing_entries_exit_2_saying_why(offline, tmp_path, args, message):
    write_repo(offline, "org/vit", _vit_files(), commit=COMMIT_A)
    r = CliRunner().invoke(main, ["export", "--checkpoint", *args, "--out",
                                  str(tmp_path / "b")])
    assert r.exit_code == 2, r.output
    assert message.format(cache=offline) in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output and not (tmp_path / "b").exists()


def test_a_cache_without_the_weights_says_so(offline):
    files = _vit_files()
    del files["model.safetensors"]
    write_repo(offline, "org/vit", files, commit=COMMIT_A)
    with pytest.raises(HubError, match=r"found neither of \['model.safetensors', "
                                       r"'pytorch_model.bin'\] in the cache \(offline\)"):
        resolve_hub("hf:org/vit")


def test_paths_are_not_hub_names(tmp_path):
    assert parse_hub_name(str(tmp_path)) is None and parse_hub_name("weights.pth") is None
    assert str(parse_hub_name("timm:vit_base_patch16_224.augreg_in21k@v1")) == \
        "timm:vit_base_patch16_224.augreg_in21k@v1"


@pytest.mark.parametrize("crop,resize", [(224, 256), (224, 248), (224, 235), (384, 384),
                                         (32, 36), (518, 592), (7, 11)])
def test_crop_pct_reproduces_the_integer_resize(crop, resize):
    import math

    assert math.floor(crop / crop_pct_for(crop, resize)) == resize
