"""Checkpoints in the form the hub publishes them.

tests/data/published/ORG--NAME/ holds a repository's config.json and / or
preprocessor_config.json byte for byte as the hub served them (where each was found and how
it was verified: SOURCES.md there). What a user's checkpoint directory holds beside them is
built here: for a config.json, a random-weight model of its architecture, depth and width
shrunk and every other field as published, put with the published files into a hub cache
(the layout huggingface_hub reads) and exported offline by name, as a user does; its bundle
must give transformers' own outputs. For a preprocessor_config.json, our pixel tensors must
be transformers' own image processor's, built from that file. A family whose published file
the exporter cannot read fails here.

The defaults transformers applies to a field a file leaves out are ours too
(checkpoints.defaults): each is compared with the installed transformers.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner

import transformers
from hub_cache import COMMIT_A, write_repo
from pixels import SIZES, photo
from vit_deploy.cli import main
from vit_deploy.export.checkpoints import TOWER_ACTS
from vit_deploy.export.checkpoints.defaults import (CONFIG_DEFAULTS, INT_SIZE_IS_SHORTEST_EDGE,
                                                    PROCESSOR_DEFAULTS, PROCESSOR_OF_MODEL)
from vit_deploy.export.sources import open_checkpoint
from vit_deploy.runtime.contract import MODEL_FILE
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.preprocess import Preprocess

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published"
REPOS = sorted(p.name for p in PUBLISHED.iterdir() if p.is_dir())
CONFIGS = [r for r in REPOS if (PUBLISHED / r / "config.json").is_file()]
PROCESSORS = [r for r in REPOS if (PUBLISHED / r / "preprocessor_config.json").is_file()]
# The model_type of a repository whose config.json is not among the fixtures (a processor
# that names no class is picked by it, in transformers as in vit-deploy).
MODEL_TYPE = {"google--vit-base-patch16-224": "vit"}
# Shrunk: the towers' width and depth only.
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2)


def repo_id(folder: str) -> str:
    return folder.replace("--", "/", 1)


def published(folder: str, name: str) -> bytes:
    return (PUBLISHED / folder / name).read_bytes()


def shrunk(config: dict) -> dict:
    """The published config with each tower (the config itself, or its vision_config and
    text_config) 32 wide, 2 layers deep, 2 heads; an intermediate_size it states, 64."""
    config = json.loads(json.dumps(config))
    towers = [config[k] for k in ("vision_config", "text_config", "vision_config_dict",
                                  "text_config_dict") if isinstance(config.get(k), dict)]
    for tower in towers or [config]:
        tower.update(SMALL)
        if "intermediate_size" in tower:
            tower["intermediate_size"] = 64
    return config


def build(config: dict) -> transformers.PreTrainedModel:
    """The published architecture (config.json's `architectures`; where it names none, the
    model transformers' AutoModel makes of its model_type), random weights moved off their
    initialisation (layer norms, layer scales), seed 0."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_text(json.dumps(config))
        cfg = transformers.AutoConfig.from_pretrained(d)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = (getattr(transformers, config["architectures"][0])(cfg)
                 if config.get("architectures") else transformers.AutoModel.from_config(cfg))
        model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def weights(model) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        return Path(d, "model.safetensors").read_bytes()


def image_features(model, x: torch.Tensor) -> dict[str, np.ndarray]:
    """What transformers gives for a batch, under the names of our outputs: logits (a
    classifier), else pooled (a dual encoder's image embedding; a backbone's pooler_output)."""
    with torch.no_grad():
        if hasattr(model, "vision_model"):  # CLIPModel, SiglipModel
            out = model.vision_model(pixel_values=x, interpolate_pos_encoding=True)
            pooled = out.pooler_output
            if getattr(model, "visual_projection", None) is not None:
                pooled = model.visual_projection(pooled)
            return {"pooled": pooled.numpy()}
        out = model(pixel_values=x)
        if hasattr(out, "logits"):
            return {"logits": out.logits.numpy()}
        return {"pooled": out.pooler_output.numpy()}


@pytest.fixture()
def hub(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_the_fixtures_are_there_and_sourced():
    sources = (PUBLISHED / "SOURCES.md").read_text()
    assert CONFIGS and PROCESSORS
    for folder in REPOS:
        for f in sorted((PUBLISHED / folder).iterdir()):
            json.loads(f.read_text())  # valid JSON, as published
            assert f"| {repo_id(folder)} | {f.name} |" in sources, (folder, f.name)


@pytest.mark.slow
@pytest.mark.parametrize("folder", CONFIGS)
def test_published_config_exports_and_matches_transformers(folder, hub, tmp_path):
    config = shrunk(json.loads(published(folder, "config.json")))
    model = build(config)
    files = {"config.json": json.dumps(config, indent=2).encode(),
             "model.safetensors": weights(model)}
    if folder in PROCESSORS:
        files["preprocessor_config.json"] = published(folder, "preprocessor_config.json")
    write_repo(hub, repo_id(folder), files, commit=COMMIT_A)
    out = tmp_path / "bundle"
    r = CliRunner().invoke(main, ["export", "--checkpoint", f"hf:{repo_id(folder)}",
                                  "--out", str(out), "--no-simplify", "--quiet"])
    assert r.exit_code == 0, r.output
    m = load_manifest(out)
    theirs = getattr(model.config, "vision_config", None) or model.config  # the image tower's
    assert (m.config.width, m.config.norm_eps, m.config.act) == (
        theirs.hidden_size, theirs.layer_norm_eps, TOWER_ACTS[theirs.hidden_act])
    session = ort.InferenceSession(str(out / MODEL_FILE), providers=["CPUExecutionProvider"])
    H, W = m.config.img_size
    P = m.config.patch_size
    for hw in ((H, W), (H + 2 * P, W - P)):  # native, and another grid (positions resampled)
        x = np.random.default_rng(0).standard_normal((2, 3, *hw), dtype=np.float32)
        want = image_features(model, torch.from_numpy(x))
        names = [n for n in want if n in m.io.output_names]
        assert names, (list(want), m.io.output_names)
        for name, got in zip(names, session.run(names, {"pixel_values": x})):
            ref = want[name]
            gap = float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max())))
            assert got.shape == ref.shape and gap <= 1e-4, (folder, hw, name, gap)


@pytest.mark.parametrize("folder", PROCESSORS)
def test_published_processor_gives_transformers_tensors(folder, tmp_path):
    directory = tmp_path / folder
    directory.mkdir()
    shutil.copy(PUBLISHED / folder / "preprocessor_config.json", directory)
    config = PUBLISHED / folder / "config.json"
    model_type = json.loads(config.read_bytes())["model_type"] if config.is_file() \
        else MODEL_TYPE[folder]
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    theirs = transformers.AutoImageProcessor.from_pretrained(directory, backend="pil")
    src = open_checkpoint(directory, source="hf").preprocess
    ours = Preprocess(resolution=src.size, patch_size=1, mean=src.mean, std=src.std,
                      resize=src.resize, interpolation=src.interpolation, scale=src.scale,
                      crop_pct=src.crop_pct)
    step = np.asarray(ours.std, np.float32)[:, None, None] / np.float32(ours.scale)
    for w, h in SIZES:
        want = theirs(photo(w, h), return_tensors="np")["pixel_values"][0]
        got = ours(photo(w, h))
        assert got.shape == want.shape, (folder, (w, h), got.shape, want.shape)
        assert float((np.abs(got - want) * step).max()) <= 1e-3, (folder, (w, h))


@pytest.mark.parametrize("model_type", sorted(CONFIG_DEFAULTS))
def test_config_defaults_are_transformers_own(model_type):
    theirs = transformers.AutoConfig.for_model(model_type).to_dict()
    for key, value in CONFIG_DEFAULTS[model_type].items():
        assert theirs[key] == value, (model_type, key, theirs[key], value)


@pytest.mark.parametrize("name", sorted(PROCESSOR_DEFAULTS))
def test_processor_defaults_are_transformers_own(name):
    pil = getattr(transformers, name + "Pil", None)
    if pil is None:  # DINOv3's has only a torchvision backend, which cannot load here: its
        # class body is read as text, the constants it names from transformers
        from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
        source = Path(transformers.__file__).parent.joinpath(
            "models", "dinov3_vit", "image_processing_dinov3_vit.py").read_text()
        body = source[source.index(f"class {name}("):]
        for line in ("resample = PILImageResampling.BILINEAR", "image_mean = IMAGENET_DEFAULT_MEAN",
                     "image_std = IMAGENET_DEFAULT_STD", 'size = {"height": 224, "width": 224}'):
            assert line in body, line
        assert "default_to_square" not in body
        row = PROCESSOR_DEFAULTS[name]
        assert (row["resample"], row["size"]) == (2, {"height": 224, "width": 224})
        assert (row["image_mean"], row["image_std"]) == (list(IMAGENET_DEFAULT_MEAN),
                                                         list(IMAGENET_DEFAULT_STD))
        assert name not in INT_SIZE_IS_SHORTEST_EDGE
        return
    for key, value in PROCESSOR_DEFAULTS[name].items():
        theirs = getattr(pil, key)
        assert (list(theirs) if isinstance(theirs, (list, tuple)) else theirs) == value, (
            name, key, theirs, value)
    assert (name in INT_SIZE_IS_SHORTEST_EDGE) == (not pil.default_to_square), name


def test_processor_of_a_model_type_is_transformers_choice():
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    for model_type, name in PROCESSOR_OF_MODEL.items():
        assert IMAGE_PROCESSOR_MAPPING_NAMES[model_type]["torchvision"] == name, model_type
