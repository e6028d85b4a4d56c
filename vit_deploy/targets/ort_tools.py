"""ORT's own tools on an edge target's graphs (docs/edge-targets.md: they judge mobile readiness, not
our opinion): the ORT-format converter and the mobile usability checker."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import onnx

from vit_deploy.runtime.files import link_or_copy
from vit_deploy.targets.report import GraphResult

# ORT format: the converter's optimisation level. Mobile keeps standard ops (level basic,
# what ORT's mobile checker judges), so NNAPI / CoreML can take the nodes; web runs on the
# WASM CPU kernels, which take ORT's fused contrib ops (level all).
ORT_FORMAT_LEVEL = {"mobile": "basic", "web": "all"}


def _to_ort(stage: Path, folder: str, results: list[GraphResult],
            target: str) -> tuple[str, dict[str, Any]]:
    """ORT's own converter over the target's passing graphs: one .ort per graph and one
    required_operators config for a reduced-operator build."""
    import onnxruntime as ort

    level = ORT_FORMAT_LEVEL[target]
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in", Path(tmp) / "out"
        src.mkdir()
        for r in results:
            link_or_copy(stage / r.file, src / Path(r.file).name)
        env = {**os.environ, "ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL": level}
        run = subprocess.run([sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort",
                              str(src), "--output_dir", str(out), "--optimization_style", "Fixed",
                              "--target_platform", "arm"], capture_output=True, text=True,
                             env=env, timeout=3600)
        if run.returncode != 0:
            raise RuntimeError(f"onnxruntime's ORT-format converter failed: "
                               f"{(run.stderr or run.stdout).strip().splitlines()[-1:]}")
        for r in results:
            produced = sorted(out.glob(f"{Path(r.file).stem}*.ort"))
            if len(produced) != 1:
                raise RuntimeError(f"the converter wrote {len(produced)} .ort files for {r.file}")
            r.ort_file = f"{folder}/{produced[0].name}"
            shutil.move(str(produced[0]), stage / r.ort_file)
        configs = sorted(out.glob("required_operators*.config"))
        if len(configs) != 1:
            raise RuntimeError(f"the converter wrote {len(configs)} operator configs")
        ops_file = f"{folder}/{configs[0].name}"
        lines = [line if not line.startswith("# - ") else f"# - {Path(line[4:]).name}"
                 for line in configs[0].read_text().splitlines()]  # no temp paths in the bundle
        (stage / ops_file).write_text("\n".join(lines) + "\n")
    proto = onnx.load(str(stage / results[0].file), load_external_data=False)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return ops_file, {"files": len(results), "optimization_level": level, "style": "Fixed",
                      "target_platform": "arm", "onnxruntime": ort.__version__, "opset": opset,
                      "ir_version": proto.ir_version,
                      "loads_in": f"each .ort loaded and checked in onnxruntime {ort.__version__} "
                                  f"here; ORT loads ORT-format files of its own release or older, "
                                  f"so use onnxruntime >= {ort.__version__} (full or mobile build "
                                  f"with the listed operators)"}


def mobile_check(path: Path) -> dict[str, dict[str, Any]]:
    """ORT's own mobile usability checker (the code behind `python -m
    onnxruntime.tools.check_onnx_model_mobile_usability`) on one graph, as it judges it:
    optimised to level basic first, shapes as they are in the file."""
    from onnxruntime.tools.mobile_helpers import usability_checker as uc
    from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

    checks = {"NNAPI": uc.check_nnapi_partitions,
              "CoreML MLProgram": lambda m, fixed: uc.check_coreml_partitions(
                  m, fixed, "coreml_supported_mlprogram_ops.md"),
              "CoreML NeuralNetwork": lambda m, fixed: uc.check_coreml_partitions(
                  m, fixed, "coreml_supported_neuralnetwork_ops.md")}
    logging.getLogger("usability_checker").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        optimised = Path(tmp) / Path(path).name
        optimize_model(Path(path), optimised, use_external_initializers=True)
        model = ModelProtoWithShapeInfo(optimised).model_with_shape_info
        out = {}
        for ep, check in checks.items():
            info = check(model, True)
            out[ep] = {"nodes": info.num_nodes, "supported_nodes": info.num_supported_nodes,
                       "partitions": info.num_partitions,
                       "unsupported_ops": sorted(info.unsupported_ops),
                       "dynamic_shape_nodes": info.nodes_unsupported_due_to_dynamic_input,
                       "verdict": info.suitability().name}
    return out
