"""A server's largest image (issue: one binary v2 request of [1, 3, 1280, 1280] to the tiny
model got the server OOM-killed in a 4 GB container): by default the bundle's largest checked
size bounds a v2 tensor's sides, `Limits(max_side=...)` / `serve --max-size` changes it; above
it the request is answered 413 before its data is read, and the server answers the next."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from vit_deploy.cli import main
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.runtime import ViTSession
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.serve.app import make_app
from vit_deploy.serve.limits import Limits, largest_checked_side


@pytest.fixture(scope="module")
def bundle(make_tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("max-size") / "tiny"
    export_bundle(make_tiny(), out, options=ExportOptions(resolution=(32, 48), simplify=False))
    return out


def _infer(client, side: int):
    x = np.zeros((1, 3, side, side), np.float32)
    body = {"inputs": [{"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    return client.post("/v2/models/tiny/infer", json=body)


def test_the_bundles_largest_checked_size_bounds_a_request(bundle):
    manifest = load_manifest(bundle)
    side = largest_checked_side(manifest)
    assert side == max(max(manifest.deploy_resolution), max(manifest.native_resolution),
                       *(max(c.resolution) for c in manifest.references.cases))
    P = manifest.config.patch_size
    with ViTSession(bundle) as s, TestClient(make_app(s)) as client:
        assert _infer(client, side).status_code == 200
        r = _infer(client, side + P)
        assert r.status_code == 413 and f"sides up to {side}" in r.json()["error"], r.text
        assert _infer(client, side).status_code == 200  # and it lives on
    with ViTSession(bundle) as s, TestClient(make_app(s, limits=Limits(max_side=side + P))) as c:
        assert _infer(c, side + P).status_code == 200  # the user's own bound


def test_max_size_is_a_serve_option_and_ray_replicas_take_it(bundle, tmp_path):
    """`--max-size` was refused with --ray / --write-config: Ray Serve replicas now bound
    sides by it too (the written config carries it; a replica's app answers 413 above it)."""
    import yaml

    from vit_deploy.ray.serve_app import RayServeOptions, replica_app

    r = CliRunner().invoke(main, ["serve", str(bundle), "--max-size", "0"])
    assert r.exit_code == 2 and "--max-size" in r.output
    out = tmp_path / "tiny.serve.yaml"
    r = CliRunner().invoke(main, ["serve", str(bundle), "--max-size", "64", "--write-config",
                                  str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    args = yaml.safe_load(out.read_text())["applications"][0]["args"]
    assert args["max_side"] == 64
    options = RayServeOptions.from_dict({k: v for k, v in args.items() if k != "bundle"})
    with ViTSession(bundle) as s:
        app = replica_app(s, options)
        assert app.state.limits.max_side == 64
        with TestClient(app) as client:  # the replica's batch worker is Ray's: not started
            r = _infer(client, 72)
            assert r.status_code == 413 and "sides up to 64" in r.json()["error"], r.text
    with pytest.raises(ValueError, match="max_side=0"):
        RayServeOptions(max_side=0)
