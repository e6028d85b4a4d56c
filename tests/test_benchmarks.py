"""benchmarks/cpu_vs_peers.py: its operation count, and one engine per fresh process."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "cpu_vs_peers.py"


def _script():
    spec = importlib.util.spec_from_file_location("cpu_vs_peers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind", [{"pool": "cls"}, {"pool": "mean"},
                                  {"pos_embed": "factorized"}, {"num_registers": 4}], ids=str)
@pytest.mark.parametrize("hw", [None, (48, 64)], ids=["native", "48x64"])
def test_operation_count_equals_torchs_flop_counter(make_tiny, kind, hw):
    model = make_tiny(**kind).eval()
    cfg = model.cfg
    h, w = hw or cfg.img_size
    # the math backend: the counter does not count the CPU's fused attention kernel
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, h, w))
    ops = _script().model_ops(cfg.to_dict(), h, w)
    assert sum(ops.values()) == counter.get_total_flops()


def test_each_engine_runs_alone_in_fresh_processes(quantised_bundle, tmp_path):
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(SCRIPT), str(quantised_bundle), "--res", "24x40",
                        "--rounds", "2", "--runs", "3", "--warmup", "1", "--threads", "2",
                        "--engines", "torch,ort:fp32,ort:int8,ort:fp16", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["threads"] == 2 and report["rounds"] == 2
    assert report["peak_gops"]["fp32"] > 0 and report["peak_gops"]["int8"] > 0
    result = report["results"]["24x40 batch 1"]
    assert len(result["thread_scaling"]) == 2 and all(v > 0 for v in result["thread_scaling"])
    engines = result["engines"]
    assert set(engines) == {"torch", "ort:fp32", "ort:int8"}  # the bundle has no fp16
    assert "ort:fp16 at 24x40 batch 1: failed" in r.stderr
    for name, row in engines.items():
        assert len(row["per_process_ms"]) == 2  # one process per round
        assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert ("CPUExecutionProvider" in row["engine"]) == name.startswith("ort:")
    assert engines["torch"]["ratio_to_torch"] == 1.0
    assert "| ort:int8 | onnxruntime" in r.stdout
