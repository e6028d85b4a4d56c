"""Token merging (ToMe) in the model and in the graph, as ToMe's reference implementation
does it (facebookresearch/ToMe, `tome.patch.timm(model, prop_attn=True)`, constant r): the
matching on hand-made tokens, the merge, proportional attention, the clamp that lets every
input size run, and PyTorch and ONNX Runtime against a test oracle at several sizes and
batches.

The oracle (tests/export/tome_reference.py) is the reference algorithm written out plainly,
token by token. It was checked against the reference's own code once, on 2026-12-01:
`python scripts/tome_reference_check.py --tome CHECKOUT` with facebookresearch/ToMe at
af95e4b (its timm patch over a minimal stand-in for timm's three classes), three tiny
models (class token, merge 4,3,4; class + distillation token, 3,3,3; no prefix token, mean
pooling, 4,4,2), 32x32, 48x64, 16x24, 8x8, 24x16 (the last three where the clamp bites), batches
1 and 3: the oracle's logits equal the reference's exactly (max |delta| 0.0 in all 30
cases); our PyTorch model is within 3.6e-7 (relative to max(1, max|ref|)) of the reference,
tokens and logits. The same script on the ViT-B/16 bundle (merge 56) is recorded in
docs/compute-budgets.md.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tome_reference import merge_one_image, reference_forward

from vit_deploy.export.model import Attention, build_model, numpy_forward
from vit_deploy.export.onnx import export_onnx
from vit_deploy.export.token_merge import bipartite_soft_matching, merge_tokens
from vit_deploy.parity import batch_independence
from vit_deploy.runtime.config import ViTConfig, variant


def _unit(*rows):
    return torch.tensor(rows, dtype=torch.float32)[None]  # (1, T, d)


def _within_fp32_policy(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    cos = (got * ref).sum() / np.sqrt((got ** 2).sum() * (ref ** 2).sum())
    return np.abs(got - ref).max() <= 1e-4 * max(1, np.abs(ref).max()) and cos >= 0.99999


def test_all_tokens_alternate_the_class_token_never_merges_and_survivors_keep_the_reference_order():
    # 7 tokens: A = 0 (class), 2, 4, 6; B = 1, 3, 5
    metric = _unit([9, 9, 9],  # 0 class token: identical to token 3, still never merged
                   [1, 0, 0], [0, 1, 0],  # 1 (B), 2 (A)
                   [9, 9, 9], [0, 0, 1],  # 3 (B), 4 (A)
                   [1, 1, 0], [9, 9, 9.001])  # 5 (B), 6 (A): 6 ~ 3
    src, dst, order = bipartite_soft_matching(metric, 1, prefix=1)
    assert src.tolist() == [[6]] and dst.tolist() == [[3]]  # the near-identical pair
    # [class token, unmerged A by index, every B by index]: the reference's concatenation
    assert order.tolist() == [[0, 2, 4, 1, 3, 5]]
    src, dst, order = bipartite_soft_matching(metric, 2, prefix=1)
    assert src.tolist() == [[6, 2]] and dst.tolist() == [[3, 5]]  # 2 ~ 5: cos 0.71
    assert order.tolist() == [[0, 4, 1, 3, 5]]
    # r = 5 asks for more than 7 tokens allow: min(5, (7 - 1) // 2) = 3 merge; several A
    # tokens may merge into one B token (4 -> 3, cos 0.58)
    src, dst, order = bipartite_soft_matching(metric, 5, prefix=1)
    assert src.tolist() == [[6, 2, 4]] and dst.tolist() == [[3, 5, 3]]
    assert order.tolist() == [[0, 1, 3, 5]]


def test_without_prefix_tokens_unmerged_a_tokens_keep_the_reference_s_score_order():
    metric = _unit([1, 0, 0], [1, 0.1, 0],  # 0 (A) ~ 1 (B): cos 0.995
                   [0, 1, 0], [0, 1, 0.5],  # 2 (A) ~ 3 (B): cos 0.894
                   [0, 0, 1], [0.3, 0, 1])  # 4 (A) ~ 5 (B): cos 0.958
    src, dst, order = bipartite_soft_matching(metric, 1, prefix=0)
    assert src.tolist() == [[0]] and dst.tolist() == [[1]]
    assert order.tolist() == [[4, 2, 1, 3, 5]]  # A by descending score (argsort), then B


def test_hand_made_tokens_match_the_oracle():
    torch.manual_seed(3)
    for prefix, T, r in [(1, 9, 2), (2, 10, 3), (3, 12, 4), (0, 7, 3), (1, 2, 1), (0, 1, 1)]:
        x, size = torch.randn(1, T, 4), torch.rand(1, T, 1) + 0.5
        metric = torch.randn(1, T, 3)
        got, got_size = merge_tokens(x, size, *bipartite_soft_matching(metric, r, prefix))
        r = min(r, (T - prefix) // 2)  # the reference does nothing when r' = 0
        want, want_size = merge_one_image(x[0], size[0], metric[0], r, prefix) if r else (
            x[0], size[0])
        torch.testing.assert_close(got[0], want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_size[0], want_size, rtol=0, atol=0)


def test_merge_is_a_size_weighted_average_and_sizes_add_up():
    x = torch.tensor([[[100.0], [1.0], [2.0], [3.0], [4.0]]])  # class token + 4 patches
    size = torch.tensor([[[1.0], [1.0], [3.0], [1.0], [1.0]]])
    # merge token 2 (A, size 3) into token 1 (B, size 1), and token 4 into token 3
    src, dst, order = torch.tensor([[2, 4]]), torch.tensor([[1, 3]]), torch.tensor([[0, 1, 3]])
    merged, new_size = merge_tokens(x, size, src, dst, order)
    assert merged[0, :, 0].tolist() == [100.0, (1 * 1 + 2 * 3) / 4, (3 + 4) / 2]
    assert new_size[0, :, 0].tolist() == [1.0, 4.0, 2.0]
    assert new_size.sum() == size.sum()  # nothing lost, nothing counted twice


def test_proportional_attention_treats_a_merged_token_as_its_copies():
    """Two identical tokens, or one of them with size 2: every query sees the same."""
    torch.manual_seed(0)
    cfg = variant("S/8", width=16, heads=2, depth=1, img_size=(16, 16))
    attn = Attention(cfg).eval()
    base = torch.randn(1, 3, 16)
    twice = torch.cat([base, base[:, 2:]], dim=1)  # token 2 duplicated
    with torch.no_grad():
        full, _ = attn(twice)
        merged, _ = attn(base, torch.tensor([[[1.0], [1.0], [2.0]]]))
    torch.testing.assert_close(merged, full[:, :3], rtol=1e-5, atol=1e-6)


def test_a_merging_model_keeps_prefix_tokens_and_counts_every_patch():
    cfg = variant("S/8", depth=3, width=32, heads=2, img_size=(32, 32), num_classes=4,
                  num_registers=1, merge=(3, 2, 2))
    model = build_model(cfg, seed=0)
    x = torch.randn(2, 3, 40, 48)  # 5 x 6 = 30 patches -> 23 after merging 7
    with torch.no_grad():
        t = model.forward_tokens(x)
    assert t.normed.shape == (2, 2 + 30 - 7, 32)
    assert torch.all(t.size[:, :2] == 1)  # class token and register: never merged
    assert torch.all(t.size.sum(dim=1) == 2 + 30)


def test_every_size_runs_small_ones_merging_what_their_tokens_allow():
    cfg = variant("S/8", depth=2, width=32, heads=2, img_size=(32, 32), merge=(4, 4))
    assert cfg.merge_schedule(16) == (4, 4)
    # 2 x 5 = 10 patches: block 1 merges min(4, 10 // 2), block 2 min(4, (11 - 4 - 1) // 2)
    assert cfg.merge_schedule(10) == (4, 3)
    assert cfg.merge_schedule(1) == (0, 0)
    model = build_model(cfg)
    for hw, patches in [((16, 40), 10), ((8, 8), 1), ((8, 16), 2)]:
        with torch.no_grad():
            t = model.forward_tokens(torch.randn(1, 3, *hw))
        assert t.normed.shape[1] == 1 + patches - sum(cfg.merge_schedule(patches)), hw
        assert t.size.sum() == 1 + patches
    with pytest.raises(ValueError, match="merge must be empty or 2 numbers"):
        cfg.replace(merge=(1, 2, 3))
    assert ViTConfig.from_json(cfg.to_json()).merge == (4, 4)


TINY = dict(width=48, heads=3, img_size=(32, 32), num_classes=5)
# (32, 32) native, (48, 64) and (40, 24) non-square, the last three where the clamp bites
SIZES = [((32, 32), 1), ((48, 64), 3), ((40, 24), 2), ((16, 24), 2), ((8, 16), 1), ((8, 8), 3)]


def _perturbed(cfg, seed=1):
    model = build_model(cfg, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("kind,overrides,merge", [
    ("class token", dict(), (4, 3, 4)),
    ("class + distillation token", dict(dist_token=True), (3, 3, 3)),
    ("class token + 2 registers", dict(num_registers=2), (3, 4, 2)),
    ("no prefix token, mean pooling", dict(class_token=False, pool="mean"), (4, 4, 2)),
])
def test_pytorch_matches_the_reference_algorithm(kind, overrides, merge):
    model = _perturbed(variant("S/8", depth=3, merge=merge, **TINY, **overrides))
    rng = np.random.default_rng(0)
    for hw, batch in SIZES:
        x = torch.from_numpy(rng.standard_normal((batch, 3, *hw), dtype=np.float32))
        with torch.no_grad():
            got = model(x)
        assert _within_fp32_policy(got, reference_forward(model, x, merge)), (kind, hw, batch)


@pytest.fixture(scope="module", params=["cls", "mean"])
def merged_onnx(request, tmp_path_factory):
    overrides = dict() if request.param == "cls" else dict(class_token=False, pool="mean")
    model = _perturbed(variant("S/8", depth=2, merge=(4, 3), **TINY, **overrides))
    path = export_onnx(model, tmp_path_factory.mktemp("tome") / "m.onnx")
    return model, path


def test_the_graph_matches_the_reference_at_every_size(merged_onnx):
    model, path = merged_onnx
    proto = onnx.load(str(path))
    ops = {n.op_type for n in proto.graph.node}
    assert {"TopK", "ArgMax", "GatherElements", "ScatterElements"} <= ops
    reductions = {a.s.decode() for n in proto.graph.node if n.op_type == "ScatterElements"
                  for a in n.attribute if a.name == "reduction"}
    assert "add" in reductions
    # Sizes stay linear: each block's clamp is a fresh size, never Min(...) of the last
    dims = {d.dim_param for v in proto.graph.value_info for d in v.type.tensor_type.shape.dim}
    assert max(d.count("Min(") for d in dims) <= 1
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    run = lambda x: session.run(None, {"pixel_values": x})[0]  # noqa: E731
    rng = np.random.default_rng(0)
    for hw, batch in SIZES + [((104, 136), 1)]:
        x = rng.standard_normal((batch, 3, *hw), dtype=np.float32)
        ref = reference_forward(model, torch.from_numpy(x), model.cfg.merge).numpy()
        assert _within_fp32_policy(run(x), ref), (hw, batch)
    for subject, f in (("pytorch", numpy_forward(model)), ("onnxruntime", run)):
        check = batch_independence(f, (48, 64), subject=subject)
        assert check.passed, check
