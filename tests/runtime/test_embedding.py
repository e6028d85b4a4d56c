"""Images in, vectors out (vit_deploy/runtime/embedding.py): ViTSession.embed, a backbone
asked to classify, and the server's POST /embed beside /predict."""

from __future__ import annotations

import io
import json
import re
import shutil

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from vit_deploy.data import photo_paths
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.preprocess import Preprocess
from vit_deploy.serve.app import make_app


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, make_tiny):
    """A backbone (pooled and patch tokens, no classifier) and a classifier with pooled."""
    root = tmp_path_factory.mktemp("embed")
    model = make_tiny()
    export_bundle(model, root / "backbone", options=ExportOptions(
        resolution=(32, 48), outputs=("pooled", "patch_tokens")))
    export_bundle(model, root / "classifier", options=ExportOptions(
        resolution=(32, 48), outputs=("logits", "pooled")))
    return root / "backbone", root / "classifier"


def _png(value: int, size=(40, 60)) -> bytes:
    rng = np.random.default_rng(value)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_embed_takes_images_and_gives_the_pooled_vectors(bundles):
    backbone, classifier = bundles
    photos = photo_paths("eval")[:3]
    with ViTSession(backbone) as s:
        v = s.embed([*photos, _png(1)])
        x = np.stack([s.preprocess()(p) for p in [*photos, _png(1)]])
        pooled = s.run_all(x)["pooled"]
        assert v.shape == (4, pooled.shape[1]) and v.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-6)
        np.testing.assert_allclose(v, pooled / np.linalg.norm(pooled, axis=1, keepdims=True),
                                   rtol=1e-5, atol=1e-6)
        raw = s.embed(photos[0], normalize=False)  # one image: a (1, D) array
        np.testing.assert_allclose(raw[0], pooled[0], rtol=1e-5, atol=1e-6)
        other = s.embed(photos[:2], preprocess=Preprocess.from_manifest(s.manifest,
                                                                         resolution=(48, 48)))
        assert other.shape == v[:2].shape and not np.allclose(other, v[:2])  # another size
        with pytest.raises(BundleError, match=r"no 'logits' output to classify with .*use "
                                              r"embed\(\) for its 'pooled' vectors"):
            s.predict(photos[0])
    with ViTSession(classifier) as s:  # a classifier with pooled embeds too
        assert s.embed(photos[:1]).shape == (1, v.shape[1]) and s.predict(photos[0])


def test_a_model_without_a_vector_output_says_how_to_get_one(tmp_path, make_tiny):
    export_bundle(make_tiny(), tmp_path / "b", options=ExportOptions(resolution=(32, 48)))
    with ViTSession(tmp_path / "b") as s:
        with pytest.raises(BundleError, match="no one-vector-per-image output to embed with"):
            s.embed(photo_paths("eval")[0])


def test_the_server_embeds_and_refuses_to_classify_a_backbone(bundles):
    backbone, _ = bundles
    with ViTSession(backbone) as s, TestClient(make_app(s, max_batch=4)) as client:
        r = client.post("/predict", content=_png(2), headers={"content-type": "image/png"})
        assert r.status_code == 400 and "use POST /embed" in r.text, r.text
        r = client.post("/embed", content=_png(2), headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["output"] == "pooled" and body["normalized"] and body["dim"] == \
            len(body["embedding"]) and body["similarity"] == "cosine"
        np.testing.assert_allclose(body["embedding"], s.embed(_png(2))[0], rtol=1e-5,
                                   atol=1e-6)
        r = client.post("/embed", content=b"not an image", headers={"content-type": "image/png"})
        assert r.status_code == 400  # answered to the request that caused it
        assert client.get("/health").json()["status"] == "ok"


def _manifest_json(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def test_export_writes_what_the_bundle_is_for(bundles):
    backbone, classifier = bundles
    with ViTSession(backbone) as s:
        width = s.embed(_png(1)).shape[1]  # what the graph gives
    assert _manifest_json(backbone)["purpose"] == {
        "kind": "embedding", "classifier": None, "embedding": {
            "output": "pooled", "dim": width, "normalised": False, "similarity": "cosine"}}
    purpose = _manifest_json(classifier)["purpose"]
    assert purpose["kind"] == "classifier+embedding" and purpose["classifier"] == "logits"


def test_consumers_read_the_purpose_from_the_manifest(bundles, tmp_path):
    """A classifier bundle whose manifest says it only embeds is refused classification by the
    runtime and the server alike: the manifest decides, not the output names."""
    _, classifier = bundles
    b = shutil.copytree(classifier, tmp_path / "b")
    m = _manifest_json(b)
    m["purpose"] = {"classifier": None, "embedding": {"output": "pooled", "similarity": "dot"}}
    (b / "manifest.json").write_text(json.dumps(m))
    assert load_manifest(b).purpose.kind == "embedding"
    with ViTSession(b) as s, TestClient(make_app(s, max_batch=2)) as client:
        with pytest.raises(BundleError, match="use embed"):
            s.predict(_png(3))
        assert client.post("/predict", content=_png(3),
                           headers={"content-type": "image/png"}).status_code == 400
        r = client.post("/embed", content=_png(3), headers={"content-type": "image/png"})
        assert r.status_code == 200 and r.json()["similarity"] == "dot", r.text


def test_a_manifest_written_before_the_field_reads_its_purpose_from_the_outputs(bundles, tmp_path):
    backbone, _ = bundles
    b = shutil.copytree(backbone, tmp_path / "old")
    m = _manifest_json(b)
    del m["purpose"]
    (b / "manifest.json").write_text(json.dumps(m))
    assert load_manifest(b).purpose.embedding == "pooled"
    assert load_manifest(b).purpose.classifier is None


@pytest.mark.parametrize("purpose, field", [
    ([1, 2], "purpose. must be an object"),
    ({"classifier": "scores"}, "purpose.classifier must be null or one of the outputs"),
    ({"classifier": ["logits"]}, "purpose.classifier"),
    ({"embedding": "pooled"}, "purpose.embedding must be null or an object"),
    ({"embedding": {"output": "patch_tokens"}}, "purpose.embedding.output must be one of the "
                                                 "(batch, width) outputs ['pooled']"),
    ({"embedding": {"output": {"a": 1}}}, "purpose.embedding.output"),
    ({"embedding": {"output": "pooled", "dim": 31}}, "purpose.embedding.dim"),
    ({"embedding": {"output": "pooled", "dim": True}}, "purpose.embedding.dim"),
    ({"embedding": {"output": "pooled", "normalised": "yes"}}, "purpose.embedding.normalised"),
    ({"embedding": {"output": "pooled", "similarity": "euclid"}}, "purpose.embedding.similarity"),
    ({"embedding": {"output": "pooled", "similarity": ["cosine"]}}, "purpose.embedding.simil"),
])
def test_a_lying_purpose_is_one_line_error(bundles, tmp_path, purpose, field):
    backbone, _ = bundles
    b = shutil.copytree(backbone, tmp_path / "lie")
    m = _manifest_json(b)
    m["purpose"] = purpose
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=re.escape(field)):
        load_manifest(b)


def test_layer_outputs_are_ours_not_a_classifier_of_unknown_naming():
    """A backbone exported with --layers (pooled, patch_tokens, layer_1) embeds and does not
    classify; a model whose outputs have names of its own classifies with its first."""
    from vit_deploy.runtime.purpose import Purpose

    backbone = Purpose.of_outputs(["pooled", "patch_tokens", "layer_1"])
    assert backbone.classifier is None and backbone.embedding == "pooled"
    assert Purpose.of_outputs(["scores", "pooled"]).classifier == "scores"
    assert Purpose.of_outputs(["patch_tokens", "layer_12"]).kind == "features"
