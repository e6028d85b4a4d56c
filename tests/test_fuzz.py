"""Property-based: every input either works or raises our typed error."""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vit_deploy.cli import main
from vit_deploy.runtime.contract import MANIFEST_NAME
from vit_deploy.runtime import BundleError, InputError, ViTSession
from vit_deploy.runtime.preprocess import ImageError, load_image

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.uint8, np.int64,
                          np.bool_, np.complex64])
arrays = dtypes.flatmap(lambda dt: hnp.arrays(
    dt, hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=20),
    elements=None if dt in (np.bool_,) else hnp.from_dtype(np.dtype(dt), allow_nan=True,
                                                           allow_infinity=True)
    if np.dtype(dt).kind in "fc" else None))


@pytest.fixture(scope="module")
def session(tmp_path_factory, make_tiny):
    from vit_deploy.export.bundle import ExportOptions, export_bundle

    out = tmp_path_factory.mktemp("fuzz") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(simplify=False))
    with ViTSession(out) as s:
        yield s


@SETTINGS
@given(x=arrays)
def test_runtime_inputs(session, x):
    try:
        out = session.run(x)
    except InputError:
        return
    assert x.ndim == 4 and x.shape[1] == 3 and x.shape[0] >= 1
    assert out.shape == (x.shape[0], 10) and out.dtype == np.float32


@SETTINGS
@given(data=st.binary(max_size=300))
def test_image_bytes(data):
    try:
        image = load_image(data)
    except ImageError:
        return
    assert image.mode == "RGB"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) |
    st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3), max_leaves=8)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory, session):
    return session.model_path.parent


@SETTINGS
@given(path=st.lists(st.sampled_from(["config", "preprocess", "io", "files", "models",
                                      "labels", "format_version", "model.onnx", "patch_size",
                                      "resolution", "mean", "std", "sha256", "size", "fp32",
                                      "in_chans", "heads", "dynamic", "inputs", "outputs", "export", "parity",
                                      "resize", "interpolation", "scale", "img_size", "name",
                                      "width", "depth", "num_classes", "cases", "nodes",
                                      "precisions", "role", "simplify"]),
                      min_size=1, max_size=3),
       value=json_values)
def test_manifest_mutations(bundle_dir, tmp_path_factory, path, value):
    bundle = tmp_path_factory.mktemp("m") / "b"
    shutil.copytree(bundle_dir, bundle)
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    node = manifest
    for key in path[:-1]:  # walk as far as the path exists, then overwrite one field
        if not isinstance(node, dict) or not isinstance(node.get(key), dict):
            break
        node = node[key]
    if isinstance(node, dict):
        node[path[-1]] = value
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))
    try:
        with ViTSession(bundle) as s:
            out = s.run(np.zeros((1, 3, 16, 16), np.float32))
            assert out.shape[0] == 1
    except (BundleError, InputError):
        pass
    r = CliRunner().invoke(main, ["info", str(bundle)])
    assert r.exit_code in (0, 2) and "Traceback" not in r.output, r.output


finite_or_not = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**6, 10**6)


@SETTINGS
@given(mean=st.lists(finite_or_not, min_size=1, max_size=4),
       std=st.lists(finite_or_not, min_size=1, max_size=4), scale=finite_or_not,
       pixels=hnp.arrays(np.uint8, (9, 11, 3)))
def test_preprocessing_numbers_are_refused_or_give_finite_inputs(mean, std, scale, pixels):
    """Whatever mean / std / scale a manifest, checkpoint or flag gives: refused with a
    ValueError naming the field, or every pixel becomes a finite float32 (issue 24)."""
    from vit_deploy.runtime.preprocess import Preprocess

    try:
        pre = Preprocess(resolution=(8, 8), patch_size=8, mean=mean, std=std, scale=scale)
    except ValueError as e:
        assert any(k in str(e) for k in ("mean", "std", "scale")), e
        return
    assert np.isfinite(pre(pixels)).all()


@SETTINGS
@given(key=st.sampled_from(["mean", "std", "scale"]), value=finite_or_not | st.lists(
    finite_or_not, min_size=3, max_size=3))
def test_manifest_preprocessing_numbers_are_refused_or_give_finite_inputs(bundle_dir, key,
                                                                         value):
    from vit_deploy.runtime.manifest import Manifest
    from vit_deploy.runtime.preprocess import Preprocess

    m = json.loads((bundle_dir / MANIFEST_NAME).read_text())
    m["preprocess"][key] = value
    try:
        manifest = Manifest.from_json(json.dumps(m))
    except (BundleError, ValueError):  # json.dumps refuses nothing; NaN is refused on load
        return
    x = Preprocess.from_manifest(manifest)(np.full((9, 11, 3), 255, np.uint8))
    assert np.isfinite(x).all()
