"""The NPU target on the NPU's own backend: a bundle's `npu` graphs run on Qualcomm's HTP
(through `onnxruntime-qnn`, whose HTP library emulates the NPU on x86), judged like every
graph: whether each finalises with every node on HTP, which nodes fell back to the CPU
where not, and the outputs against the bundle's golden references (PyTorch's) for that
bucket, by the int8 tolerance policy (PyTorch run here, from the bundle's weights, where
the references' size bound left a bucket out), and on the photographs shipped with the
package (held out from calibration, each whole at the bucket's size) against the bundle's
fp32 graph, by the policy every precision is judged by.

`onnxruntime-qnn` depends on `onnxruntime`, which would replace onnxruntime-gpu in the
project's environment: it lives in an environment of its own (`make setup` makes
.venv-qnn), whose Python runs targets/htp_runner.py. Emulated time is no device figure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.parity import ParityCase, judge
from vit_deploy.precisions.photos import (EvalImages, PhotoCase, digits_images,
                                          fp32_photo_batches, judge_photos)
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.references import iter_references

# The HTP architectures tested (htp_arch, and the soc_model QNN is told with it, as the QNN
# SDK numbers them): docs/edge-targets.md
HTP_ARCHS: dict[str, str] = {"73": "57", "75": "69", "79": "87"}
DIGITS_JUDGED = 24  # held-out digits for a target calibrated on them
RUNNER = Path(__file__).with_name("htp_runner.py")
QNN_PACKAGE = "onnxruntime-qnn==2.7.0"
# Emulated HTP is slow: ViT-B/16 at 224 with its context took 15 min on htp_arch 73 and 40 min
# on 75 (2 cores, 2026-12-06). The runner's time bound grows with the work asked of it.
RUNNER_SECONDS_PER_GRAPH = 3600


@dataclass
class HTPGraph:
    """One npu graph on one HTP architecture."""

    file: str
    htp_arch: str
    soc_model: str
    finalised: bool  # every node on HTP, CPU fallback disabled
    error: str | None
    htp_partitions: int
    cpu_nodes: list[dict[str, str]]
    parity: list[ParityCase] = field(default_factory=list)
    photos: list[PhotoCase] = field(default_factory=list)  # per output, on the photographs
    context: dict[str, Any] | None = None  # the compiled context: {file, max_abs} or {error}

    @property
    def passed(self) -> bool:
        return (self.finalised and not self.cpu_nodes and bool(self.parity) and bool(self.photos)
                and all(c.passed for c in [*self.parity, *self.photos]))

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "htp_arch": self.htp_arch, "soc_model": self.soc_model,
                "passed": self.passed, "finalised": self.finalised, "error": self.error,
                "htp_partitions": self.htp_partitions, "cpu_nodes": self.cpu_nodes,
                "parity": [asdict(c) | {"label": c.label} for c in self.parity],
                "photos": [c.to_dict() for c in self.photos], "context": self.context}

    def line(self) -> str:
        where = ("every node on HTP" if self.finalised and not self.cpu_nodes else
                 f"{len(self.cpu_nodes)} node(s) on the CPU: "
                 f"{sorted({n['op'] for n in self.cpu_nodes})}" if self.cpu_nodes else
                 f"not finalised: {self.error}")
        worst = min((c.cosine for c in self.parity), default=float("nan"))
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict} {self.file} htp_arch {self.htp_arch} (soc_model {self.soc_model}): "
                f"{where}; {self.htp_partitions} HTP partition(s); "
                f"parity vs PyTorch: {sum(c.passed for c in self.parity)}/{len(self.parity)} "
                f"cases, worst cosine {worst:.6f}; photographs vs fp32: "
                f"{sum(c.passed for c in self.photos)}/{len(self.photos)} outputs, worst "
                f"cosine {min((c.cosine_min for c in self.photos), default=float('nan')):.5f}"
                + ("" if self.context is None else "; compiled context: " + (
                    self.context["error"] if "error" in self.context else
                    f"reloaded, max|Δ| {self.context['max_abs']:.1e} to the compiling session")))


def qnn_python(given: str | Path | None = None) -> Path:
    """The Python that runs the HTP runner: `given`; else this one where onnxruntime-qnn
    imports here; else the .venv-qnn (make setup) beside this Python's environment (a
    checkout's .venv, its symlinks resolved: one place however the command is started), so
    the command works from any folder. Never one in the working folder: a downloaded folder
    holding `.venv-qnn/bin/python` would have its program run. A clear error where none is."""
    import importlib.util

    if given is not None:
        if not Path(given).is_file():
            raise ValueError(f"expected a Python with {QNN_PACKAGE}, got {str(given)!r}, which "
                             f"is not a file")
        return Path(given)
    if importlib.util.find_spec("onnxruntime_qnn") is not None:
        return Path(sys.executable)
    beside = Path(sys.prefix).resolve().parent / ".venv-qnn" / "bin" / "python"
    if beside.is_file():
        return beside
    raise ValueError(f"no Python with {QNN_PACKAGE} found (not this one, and no {beside}): "
                     f"give one (check's --htp-python), e.g. a venv with pip install "
                     f"{QNN_PACKAGE}, kept apart from onnxruntime-gpu")


def parse_archs(text: str) -> dict[str, str]:
    """'73,75' -> {htp_arch: soc_model}; a clear error naming the known ones."""
    given = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in given if a not in HTP_ARCHS]
    if unknown or not given:
        raise ValueError(f"expected HTP architectures of {sorted(HTP_ARCHS)}, got {text!r}")
    return {a: HTP_ARCHS[a] for a in given}


def check_htp(bundle: str | Path, *, python: str | Path, archs: dict[str, str] | None = None,
              contexts: bool = False) -> list[HTPGraph]:
    """Each npu graph of `bundle` on each HTP architecture, run by `python` (an environment
    with onnxruntime-qnn), against the bundle's golden references for its bucket.
    `contexts`: each graph that passes is compiled into an EPContext model, reloaded, run on
    every case and, where its outputs equal the compiling session's, written into the
    bundle beside the graph (targets/npu/<graph>.htp<arch>.onnx, hashed in the manifest)."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    spec = manifest.targets.get("npu")
    if spec is None:
        raise ValueError(f"bundle {str(bundle)!r} has no npu target: vit-deploy target BUNDLE "
                         f"--target npu --buckets ... --calib ... first")
    if manifest.references is None:
        raise ValueError(f"bundle {str(bundle)!r} holds no golden references to judge by")
    cases: dict[tuple[int, int], list[tuple[np.ndarray, dict[str, np.ndarray]]]] = {}
    for case, x, outputs in iter_references(manifest.resolve(bundle, manifest.references.file),
                                            manifest.references):
        if case.target == "npu":
            cases.setdefault(case.resolution, []).append((x, outputs))
    archs = archs or HTP_ARCHS
    missing = sorted({g.resolution for g in spec.graphs} - set(cases))
    if missing:  # the references' size bound left these buckets out: PyTorch, here
        cases |= _torch_cases(bundle, manifest, missing, spec.batch)
    photos = _photo_cases(bundle, manifest, sorted({g.resolution for g in spec.graphs}))
    with tempfile.TemporaryDirectory(prefix="vit-deploy-htp-") as tmp:
        graphs = []
        for g in spec.graphs:
            chunks = {f"{i}.{j}": x[j:j + g.batch] for i, (x, _) in enumerate(cases[g.resolution])
                      for j in range(0, len(x), g.batch)}
            x = photos[g.resolution][0]
            chunks |= {f"photo.{j}": x[j:j + g.batch] for j in range(0, len(x), g.batch)}
            npz = Path(tmp) / f"{Path(g.file).stem}.inputs.npz"
            np.savez(npz, **chunks)
            graphs.append({"file": str(manifest.resolve(bundle, g.file)), "inputs": str(npz)})
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps({"graphs": graphs, "archs": sorted(archs.items()),
                                       "contexts": contexts}))
        bound = RUNNER_SECONDS_PER_GRAPH * len(graphs) * len(archs)
        try:
            done = subprocess.run([str(python), str(RUNNER), str(request), tmp],
                                  capture_output=True, text=True, timeout=bound)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the HTP runner ran past {bound} s ({RUNNER_SECONDS_PER_GRAPH} s "
                               f"per graph and architecture: {len(graphs)} graph(s) x "
                               f"{len(archs)} architecture(s)) and was stopped; check fewer "
                               f"architectures at a time (--htp-arch)") from None
        result = Path(tmp) / "result.json"
        if done.returncode != 0 or not result.is_file():
            said = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(f"the HTP runner failed ({python}, exit {done.returncode}): "
                               + (said[-1][-400:] if said else "it wrote no result: is it a "
                                  "Python with onnxruntime-qnn?"))
        rows = json.loads(result.read_text())["results"]
        results = [_judged(row, spec.graphs, cases, photos) for row in rows]
        if contexts:
            _write_contexts(bundle, spec, results, Path(tmp))
        return results


def _write_contexts(bundle: Path, spec: Any, results: list[HTPGraph], tmp: Path) -> None:
    """Each passing graph's compiled context whose outputs equal its own, into the bundle
    beside the graph (replacing an older one of that architecture), under the writer lock."""
    from vit_deploy.runtime.files import link_or_copy
    from vit_deploy.runtime.swap import staging_directory, writer_lock
    from vit_deploy.targets.build import rewrite_target

    made: dict[str, dict[str, str]] = {}
    for r in results:
        if r.passed and r.context and r.context.get("max_abs") == 0.0:
            made.setdefault(r.file, {})[r.htp_arch] = r.context["file"]
    if not made:
        return
    with writer_lock(bundle):
        manifest = load_manifest(bundle)
        if manifest.targets.get("npu") != spec:
            raise RuntimeError("the bundle's npu target changed while it was checked: run the "
                               "check again")
        with staging_directory(bundle) as stage:
            stage = Path(stage)
            graphs = []
            for g in spec.graphs:
                ours = dict(g.contexts)
                for arch, compiled in made.get(g.file, {}).items():
                    ours[arch] = str(Path(g.file).with_suffix(f".htp{arch}.onnx"))
                    (stage / ours[arch]).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(compiled, stage / ours[arch])
                graphs.append(replace(g, contexts=tuple(sorted(ours.items()))))
            new = replace(spec, graphs=tuple(graphs))
            for name in set(spec.files()) & set(new.files()):
                if not (stage / name).exists():
                    (stage / name).parent.mkdir(parents=True, exist_ok=True)
                    link_or_copy(bundle / name, stage / name)
            rewrite_target(bundle, manifest, new, stage)


def _photo_cases(bundle: Path, manifest: Any, sizes: list[tuple[int, int]]
                 ) -> dict[tuple[int, int], tuple[np.ndarray, dict[str, np.ndarray]]]:
    """The photographs shipped with the package (held out from calibration), each whole, and
    the fp32 graph's outputs; for a target calibrated on the digits, held-out digits (the
    test model's own data)."""
    digits = manifest.targets["npu"].record.get("calibrated_on") == "digits"
    return fp32_photo_batches(bundle, manifest, sizes, EvalImages(
        (), "", pixels=digits_images().pixels[:DIGITS_JUDGED]) if digits else None)


def _torch_cases(bundle: Path, manifest: Any, sizes: list[tuple[int, int]], batch: int
                 ) -> dict[tuple[int, int], list]:
    """Seeded inputs at each size (two graph batches) and PyTorch's outputs for them, from
    the bundle's weights, where its golden references hold none for a bucket."""
    try:
        from vit_deploy.export.checkpoints import load_model
        from vit_deploy.export.model import numpy_forward, reference_model
    except ImportError:
        raise ValueError("the bundle's references hold no case for a bucket, and PyTorch, "
                         "which would make one, is not installed: pip install "
                         "'vit-deploy[export]'") from None
    from vit_deploy.outputs import OutputSelection
    from vit_deploy.parity import sample_inputs

    if manifest.weights_file is None:
        raise ValueError(f"bundle {str(bundle)!r} holds no references for the npu buckets "
                         f"{sizes} and no PyTorch weights to make them from")
    model = load_model(manifest.resolve(bundle, manifest.weights_file))
    forward = numpy_forward(reference_model(model, OutputSelection(
        names=tuple(manifest.io.output_names), layer_norm=manifest.io.layer_norm)))
    cases = {}
    for hw in sizes:
        x = sample_inputs(hw, 2 * batch, channels=manifest.config.in_chans, seed=5)
        out = forward(x)
        cases[hw] = [(x, out if isinstance(out, dict) else {manifest.io.output_names[0]: out})]
    return cases


def _judged(row: dict[str, Any], graphs: Any, cases: dict[tuple[int, int], list],
            photos: dict[tuple[int, int], tuple[np.ndarray, dict[str, np.ndarray]]]) -> HTPGraph:
    graph = next(g for g in graphs if Path(row["file"]).name == Path(g.file).name)
    result = HTPGraph(file=graph.file, htp_arch=row["htp_arch"], soc_model=row["soc_model"],
                      finalised=row["finalised"], error=row["error"],
                      htp_partitions=row["htp_partitions"], cpu_nodes=row["cpu_nodes"],
                      context=row.get("context"))
    if "outputs" not in row:
        return result
    with np.load(row["outputs"]) as f:
        got = {k: f[k] for k in f.files}
    for i, (x, refs) in enumerate(cases[graph.resolution]):
        for name, ref in refs.items():
            out = np.concatenate([got[f"{i}.{j}/{name}"] for j in range(0, len(x), graph.batch)])
            result.parity.append(judge(ref, out, resolution=graph.resolution,
                                       provider=f"qnn-htp {row['htp_arch']}",
                                       precision=graph.precision, output=name))
    x, refs = photos[graph.resolution]
    outs = {name: np.concatenate([got[f"photo.{j}/{name}"] for j in range(0, len(x), graph.batch)])
            for name in refs}
    result.photos = judge_photos(refs, outs, resolution=graph.resolution,
                                 precision=graph.precision)
    return result


def main(argv: list[str] | None = None) -> int:
    """python -m vit_deploy.targets.htp BUNDLE [--python PY] [--arch 73,75] [--contexts]
    (vit-deploy check BUNDLE --provider qnn-htp is the same check)"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m vit_deploy.targets.htp", description=main.__doc__)
    p.add_argument("bundle")
    p.add_argument("--python", default=None,
                   help=f"a Python with {QNN_PACKAGE} (default: this one where it imports, "
                        f"else the .venv-qnn beside this Python's environment, which make "
                        f"setup makes; never one in the working folder)")
    p.add_argument("--arch", default=",".join(HTP_ARCHS),
                   help=f"HTP architectures, of {sorted(HTP_ARCHS)}")
    p.add_argument("--contexts", action="store_true",
                   help="write each passing graph's compiled HTP context (EPContext model) "
                        "into the bundle")
    args = p.parse_args(argv)
    try:
        archs, python = parse_archs(args.arch), qnn_python(args.python)
        results = check_htp(args.bundle, python=python, archs=archs, contexts=args.contexts)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    for r in results:
        print(r.line())
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
