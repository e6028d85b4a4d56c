"""Token merging (ToMe) in the model and in the graph: the merge step on hand-made tokens,
proportional attention, and ONNX Runtime against PyTorch at several sizes and batches."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from vit_deploy.runtime.config import ViTConfig, variant
from vit_deploy.export.model import Attention, build_model, numpy_forward
from vit_deploy.export.onnx import export_onnx
from vit_deploy.export.token_merge import bipartite_soft_matching, merge_tokens
from vit_deploy.parity import batch_independence
from vit_deploy.runtime.sizes import require_merge_room


def _unit(*rows):
    return torch.tensor(rows, dtype=torch.float32)[None]  # (1, T, d)


def test_identical_tokens_merge_first_and_the_class_token_stays():
    # prefix (class token) + 6 patches: A = patches 0, 2, 4; B = patches 1, 3, 5
    metric = _unit([9, 9, 9],  # class token: identical to patch 2, still never merged
                   [1, 0, 0], [0, 1, 0],  # patches 0 (A), 1 (B)
                   [9, 9, 9], [0, 0, 1],  # patches 2 (A) and 3 (B)
                   [1, 1, 0], [9, 9, 9.001])  # patches 4 (A) and 5 (B): 5 ≈ 2
    src, dst, keep = bipartite_soft_matching(metric, 1, prefix=1)
    assert src.tolist() == [[2]] and dst.tolist() == [[5]]  # the near-identical pair
    assert keep.tolist() == [[0, 1, 3, 4, 5]]  # survivors in raster order
    src, dst, keep = bipartite_soft_matching(metric, 2, prefix=1)
    # then the next best: patch 4 is closer to 5 (cos 0.82) than to 1 (0.71); several A
    # tokens may merge into one B token
    assert src.tolist() == [[2, 4]] and dst.tolist() == [[5, 5]]
    assert keep.tolist() == [[0, 1, 3, 5]]


def test_merge_is_a_size_weighted_average_and_sizes_add_up():
    x = torch.tensor([[[100.0], [1.0], [2.0], [3.0], [4.0]]])  # prefix + 4 patches
    size = torch.tensor([[[1.0], [1.0], [3.0], [1.0], [1.0]]])
    # merge patch 0 (A, size 1) into patch 1 (B, size 3), and patch 2 into patch 3
    src, dst = torch.tensor([[0, 2]]), torch.tensor([[1, 3]])
    keep = torch.tensor([[1, 3]])
    merged, new_size = merge_tokens(x, size, 1, src, dst, keep)
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


def test_too_few_patches_are_refused_readably():
    cfg = variant("S/8", depth=2, width=32, heads=2, img_size=(32, 32), merge=(4, 4))
    assert cfg.min_patches == 12  # block 2 has 16 - 4 patches left and needs 2 x 4
    require_merge_room(32, 32, cfg)
    with pytest.raises(ValueError, match="needs at least 12"):
        require_merge_room(16, 40, cfg)  # 2 x 5 = 10 patches
    with pytest.raises(ValueError, match="needs at least 12"):
        build_model(cfg)(torch.randn(1, 3, 16, 40))
    with pytest.raises(ValueError, match="merge must be empty or 2 numbers"):
        cfg.replace(merge=(1, 2, 3))
    assert ViTConfig.from_json(cfg.to_json()).merge == (4, 4)


@pytest.fixture(scope="module")
def merged_onnx(tmp_path_factory):
    cfg = variant("S/8", depth=2, width=48, heads=3, img_size=(32, 32), num_classes=5,
                  pool="mean", merge=(3, 2))  # needs 7 patches
    model = build_model(cfg, seed=1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = export_onnx(model, tmp_path_factory.mktemp("tome") / "m.onnx")
    return model, path


def test_the_graph_merges_with_ops_onnx_runtime_runs(merged_onnx):
    model, path = merged_onnx
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"TopK", "ArgMax", "GatherElements", "ScatterElements"} <= ops
    scatters = [n for n in onnx.load(str(path)).graph.node if n.op_type == "ScatterElements"]
    reductions = {a.s.decode() for n in scatters for a in n.attribute if a.name == "reduction"}
    assert "add" in reductions
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    run = lambda x: session.run(None, {"pixel_values": x})[0]  # noqa: E731
    forward = numpy_forward(model)
    rng = np.random.default_rng(0)
    for hw, batch in [((32, 32), 1), ((48, 64), 3), ((32, 24), 2), ((104, 136), 1)]:
        x = rng.standard_normal((batch, 3, *hw), dtype=np.float32)
        ref = forward(x)
        assert np.abs(run(x) - ref).max() <= 1e-4 * max(1, np.abs(ref).max()), hw
    for subject, f in (("pytorch", forward), ("onnxruntime", run)):
        check = batch_independence(f, (48, 64), subject=subject)
        assert check.passed, check
