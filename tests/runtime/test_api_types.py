"""Wrong argument types to the Python API get one clear error at the door (which argument,
what it takes, what was given), never an internal TypeError or AttributeError."""

from __future__ import annotations

import numpy as np
import pytest

from vit_deploy.runtime import Preprocess, RuntimeOptions, ViTSession, load_manifest


@pytest.fixture(scope="module")
def bundle(tiny_bundle):
    return tiny_bundle[1].path


CASES = [
    ("ViTSession(model)", lambda b: ViTSession(123)),
    ("ViTSession(model)", lambda b: ViTSession(None)),
    ("ViTSession(model)", lambda b: ViTSession(["bundle"])),
    ("provider", lambda b: ViTSession(b, provider=5)),
    ("provider", lambda b: ViTSession(b, provider=[1, 2])),
    ("provider", lambda b: ViTSession(b, provider=[("cpu", {}, 3)])),
    ("provider", lambda b: ViTSession(b, provider={"cpu": 1})),
    ("precision", lambda b: ViTSession(b, precision=8)),
    ("fallback", lambda b: ViTSession(b, fallback="no")),
    ("options", lambda b: ViTSession(b, options={"threads": 2})),
    ("target", lambda b: ViTSession(b, target=3)),
    ("images", lambda b: ViTSession(b).predict(5)),
    ("images", lambda b: ViTSession(b).predict(None)),
    ("preprocess", lambda b: ViTSession(b).predict([np.zeros((8, 8, 3), np.uint8)],
                                                   preprocess="imagenet")),
    ("top_k", lambda b: ViTSession(b).predict([np.zeros((8, 8, 3), np.uint8)], top_k="5")),
    ("load_manifest(bundle)", lambda b: load_manifest(5)),
    ("verify", lambda b: load_manifest(b, verify="no")),
    ("RuntimeOptions(verify)", lambda b: RuntimeOptions(verify="no")),
    ("RuntimeOptions(spinning)", lambda b: RuntimeOptions(spinning=1)),
    ("RuntimeOptions(allow_large)", lambda b: RuntimeOptions(allow_large=None)),
    ("RuntimeOptions(device_id)", lambda b: RuntimeOptions(device_id="0")),
    ("RuntimeOptions(device_id)", lambda b: RuntimeOptions(device_id=-1)),
    ("threads", lambda b: RuntimeOptions(threads="2")),
]


@pytest.mark.parametrize("name,call", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_a_wrong_argument_type_is_named_at_the_door(bundle, name, call):
    with pytest.raises((TypeError, ValueError)) as info:
        call(bundle)
    text = str(info.value)
    assert text.startswith(name) and " must be " in text and "got " in text, text


def test_the_right_types_still_work(bundle):
    image = np.zeros((40, 50, 3), np.uint8)
    with ViTSession(str(bundle), provider=[("cpu", {})], precision="fp32", fallback=False,
                    options=RuntimeOptions(verify=True, spinning=None), target=None) as s:
        pre = s.preprocess()
        assert isinstance(pre, Preprocess)
        one = s.predict(image, top_k=np.int64(2))
        many = s.predict((im for im in [image, image]), preprocess=pre)
    assert len(one) == 1 and len(one[0].top) == 2 and len(many) == 2
