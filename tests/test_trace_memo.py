"""The suite's trace memo (tests/conftest.py) gives what torch.onnx.export gives, and never
serves a trace of a module that has changed since."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_deploy.export.onnx import TRACE_BATCH, TRACE_GRID


def _trace_args(model):
    P = model.cfg.patch_size
    example = torch.randn(TRACE_BATCH, 3, P * TRACE_GRID[0], P * TRACE_GRID[1])
    gh, gw = torch.export.Dim("gh", min=1), torch.export.Dim("gw", min=1)
    dynamic = {"x": {0: torch.export.Dim("batch", min=1), 2: P * gh, 3: P * gw}}
    return example, dict(output_names=["logits"], dynamic_shapes=dynamic, opset=18, what="t")


def test_the_memo_serves_the_exporters_own_bytes(trace_memo, make_tiny):
    model = make_tiny("factorized", "mean", num_classes=7)
    example, kw = _trace_args(model)
    fresh = trace_memo.real(model, example, **kw).SerializeToString()
    first, again = trace_memo.memo(model, example, **kw), trace_memo.memo(model, example, **kw)
    assert first.SerializeToString() == fresh == again.SerializeToString()
    first.graph.node.pop()  # a caller changing its proto changes nobody else's
    assert trace_memo.memo(model, example, **kw).SerializeToString() == fresh


def test_the_key_names_the_same_file_in_another_process(trace_memo, make_tiny):
    """The two workers share traces as files named by the key: a fresh interpreter (another
    hash seed, other object addresses) must name the same module's trace the same way."""
    model = make_tiny("factorized", "mean")
    example, kw = _trace_args(model)
    here = trace_memo.name(trace_memo.key(model, example, **kw))
    tests = Path(__file__).parent
    script = f"""
import importlib.util, sys
sys.path.insert(0, {str(tests)!r})
spec = importlib.util.spec_from_file_location("suite_conftest", {str(tests / "conftest.py")!r})
conftest = importlib.util.module_from_spec(spec); spec.loader.exec_module(conftest)
from test_trace_memo import _trace_args
model = conftest._tiny("factorized", "mean")
example, kw = _trace_args(model)
print(conftest.memo_name(conftest.trace_key(model, example, **kw)))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == here
    other = make_tiny("factorized", "mean", num_classes=7)
    assert trace_memo.name(trace_memo.key(other, example, **kw)) != here


def test_anything_the_trace_depends_on_changes_the_key(trace_memo, make_tiny, monkeypatch):
    model = make_tiny()
    example, kw = _trace_args(model)
    key = trace_memo.key(model, example, **kw)
    assert key is not None and key == trace_memo.key(make_tiny(), example, **kw)

    other = make_tiny()
    with torch.no_grad():
        other.head.weight[0, 0] += 1e-3  # one weight
    assert trace_memo.key(other, example, **kw) != key
    assert trace_memo.key(make_tiny(num_classes=11), example, **kw) != key  # config
    assert trace_memo.key(model, example[:1], **kw) != key  # example shape
    assert trace_memo.key(model, example, **{**kw, "output_names": ["x"]}) != key
    other = make_tiny()
    other.blocks[0].attn.heads = 1  # a plain attribute of a submodule
    assert trace_memo.key(other, example, **kw) != key

    real = type(model).forward_head
    monkeypatch.setattr(type(model), "forward_head", lambda self, *a, **k: real(self, *a, **k))
    assert trace_memo.key(model, example, **kw) != key  # a method patched on the class
    monkeypatch.undo()
    assert trace_memo.key(model, example, **kw) == key


@pytest.mark.parametrize("change", ["hook", "callable attribute"])
def test_a_module_that_is_not_plain_data_is_never_memoised(trace_memo, make_tiny, change):
    model = make_tiny()
    example, kw = _trace_args(model)
    if change == "hook":
        model.blocks[1].register_forward_hook(lambda m, i, o: o * 2)
    else:
        model.blocks[1].mlp.activation = torch.nn.functional.relu  # a function
    assert trace_memo.key(model, example, **kw) is None
