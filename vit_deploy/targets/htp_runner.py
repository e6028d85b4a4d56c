"""Runs NPU graphs on Qualcomm's HTP backend, alone: the file `targets/htp.py` hands to the
Python of an environment that has `onnxruntime-qnn` (never the project's own: its
`onnxruntime` would replace onnxruntime-gpu there). It imports only numpy and onnxruntime.

    python htp_runner.py REQUEST.json OUT_DIR

REQUEST: {"graphs": [{"file", "inputs": NPZ (one array per case, the graph's batch)}],
"archs": [[htp_arch, soc_model], ...], "contexts": bool}. For each graph and architecture it writes
OUT_DIR/result.json: whether the graph finalises with every node on HTP (ONNX Runtime's CPU
fallback disabled: a node HTP refuses fails the session), else the error and, from a
session that allows the fallback, the nodes that ran on the CPU; the outputs of each case
(OUT_DIR/<graph>-<arch>.npz) from the session that ran; with "contexts", for each graph that
finalised, its compiled HTP context (OUT_DIR/<graph>.htp<arch>.onnx, an EPContext model),
reloaded and run on every case.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if os.environ.get("VIT_DEPLOY_ORT_TELEMETRY") != "1":  # nothing sent, as vit_deploy/__init__.py
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"
import onnxruntime as ort  # noqa: E402

CPU_EP, QNN_EP = "CPUExecutionProvider", "QNNExecutionProvider"


def _qnn_devices() -> list:
    try:
        import onnxruntime_qnn
    except ImportError:
        raise SystemExit(f"onnxruntime-qnn is not installed in {sys.executable} "
                         f"(make setup makes .venv-qnn with it)") from None

    library = Path(onnxruntime_qnn.__file__).parent / "libonnxruntime_providers_qnn.so"
    ort.register_execution_provider_library(QNN_EP, str(library))
    return [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]


def _session(path: str, devices: list, arch: str, soc: str, *, fallback: bool,
             profile: str | None = None, context: str | None = None) -> ort.InferenceSession:
    """`context`: also write the compiled HTP context there (ONNX Runtime's EPContext model,
    the context binary embedded), which a phone loads without compiling."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # offload_graph_io_quantization 0: the graph's input Q and output DQ run on HTP too
    # (QNN's default hands them to the CPU provider)
    so.add_provider_for_devices(devices[:1], {"backend_type": "htp", "htp_arch": arch,
                                              "soc_model": soc,
                                              "offload_graph_io_quantization": "0"})
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if fallback else "1")
    if context:
        for key, value in (("ep.context_enable", "1"), ("ep.context_file_path", context),
                           ("ep.context_embed_mode", "1")):
            so.add_session_config_entry(key, value)
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    return ort.InferenceSession(path, sess_options=so)


def _placement(session: ort.InferenceSession) -> tuple[int, list[dict[str, str]]]:
    """(HTP partitions, the nodes that ran on the CPU) from ONNX Runtime's profile."""
    events = json.loads(Path(session.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and "provider" in e.get("args", {})]
    qnn = {e["name"] for e in nodes if e["args"]["provider"] == QNN_EP}
    cpu = {(e["args"].get("op_name", "?"), e["name"].removesuffix("_kernel_time"))
           for e in nodes if e["args"]["provider"] != QNN_EP}
    return len(qnn), [{"op": op, "node": name} for op, name in sorted(cpu)]


def _context(path: str, devices: list, arch: str, soc: str, inputs: dict, outs: dict,
             dst: Path) -> dict:
    """Compile `path` into an EPContext model at `dst`, load that (no compiling, CPU fallback
    disabled) and run every case: {file, max_abs: its largest difference to the outputs of
    the session that compiled the graph}, or {error}."""
    try:
        _session(path, devices, arch, soc, fallback=False, context=str(dst))
        loaded = _session(str(dst), devices, arch, soc, fallback=False)
        name = loaded.get_inputs()[0].name
        worst = max(float(np.abs(a.astype(np.float64) - b).max())
                    for k, x in inputs.items()
                    for a, b in zip(loaded.run(None, {name: x}), outs[k]))
        return {"file": str(dst), "max_abs": worst}
    except Exception as e:
        return {"error": " ".join(str(e).split())[:600]}


def run(request: dict, out: Path) -> list[dict]:
    devices = _qnn_devices()
    if not devices:
        raise SystemExit("onnxruntime-qnn registered no QNN device")
    results = []
    for graph in request["graphs"]:
        with np.load(graph["inputs"]) as f:
            inputs = {k: f[k] for k in f.files}
        for arch, soc in request["archs"]:
            row: dict = {"file": graph["file"], "htp_arch": arch, "soc_model": soc}
            start = time.perf_counter()
            first = next(iter(inputs.values()))
            with tempfile.TemporaryDirectory() as tmp:
                profile = os.path.join(tmp, "profile")
                profiled = None
                try:  # the placement from its own profile: one compile where HTP takes all
                    session = _session(graph["file"], devices, arch, soc, fallback=False,
                                       profile=profile)
                    row.update(finalised=True, error=None)
                    session.run(None, {session.get_inputs()[0].name: first})
                    row["htp_partitions"], row["cpu_nodes"] = _placement(session)
                except Exception as e:  # QNN's refusal: finalisation failed, or a node to the CPU
                    row.update(finalised=False, error=" ".join(str(e).split())[:600])
                    session = None
                if session is None:
                    try:  # the placement (and outputs) where HTP refused: fallback allowed
                        profiled = _session(graph["file"], devices, arch, soc, fallback=True,
                                            profile=profile)
                        profiled.run(None, {profiled.get_inputs()[0].name: first})
                        row["htp_partitions"], row["cpu_nodes"] = _placement(profiled)
                    except Exception as e:
                        profiled, row["htp_partitions"], row["cpu_nodes"] = None, 0, []
                        row["error"] = row["error"] or " ".join(str(e).split())[:600]
            ran = session or profiled
            if ran is not None:
                name = ran.get_inputs()[0].name
                outs = {k: ran.run(None, {name: x}) for k, x in inputs.items()}
                names = [o.name for o in ran.get_outputs()]
                path = out / f"{Path(graph['file']).stem}-{arch}.npz"
                np.savez(path, **{f"{k}/{n}": v for k, vs in outs.items()
                                  for n, v in zip(names, vs)})
                row["outputs"] = str(path)
                row["providers"] = ran.get_providers()
                if session is not None and request.get("contexts"):
                    row["context"] = _context(graph["file"], devices, arch, soc, inputs, outs,
                                              out / f"{Path(graph['file']).stem}.htp{arch}.onnx")
            row["seconds"] = round(time.perf_counter() - start, 2)
            results.append(row)
    return results


if __name__ == "__main__":
    request_file, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    rows = run(json.loads(request_file.read_text()), out_dir)
    (out_dir / "result.json").write_text(json.dumps({"onnxruntime": ort.__version__,
                                                     "results": rows}, indent=1))
