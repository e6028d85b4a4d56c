"""OpenVINO as an engine under a ViTSession, and the choice of engine along a preference list.

`provider="openvino"` (openvino-cpu, openvino-gpu, openvino:DEVICE) runs the bundle's own
ONNX file through the `openvino` package (imported only when asked for, quietly:
providers.import_openvino_quietly):
read_model keeps the batch and grid dynamic as the file declares them, and that compiled
model serves every size; on the CPU device (RuntimeOptions.static_shapes) a model reshaped
to each input shape met is compiled on first use and kept (the last STATIC_SHAPES_KEPT),
which OpenVINO's CPU plugin runs faster (measured: docs/cpu-speed.md). It is compiled
with the LATENCY hint, RuntimeOptions.threads as INFERENCE_NUM_THREADS, and its inference
precision RuntimeOptions.float_precision: f32 by default (on CPUs with AMX it would otherwise
run what is not int8 in bf16, outside the fp32 tolerance), bf16 where asked (refused where
the device would not run it or lists no BF16 among its capabilities: OpenVINO 2026 emulates
it on AVX-512 CPUs without BF16, slower than f32). OpenVINOSession offers the part of
ort.InferenceSession that ViTSession and the bucket runner use (get_providers, get_inputs,
get_outputs, get_modelmeta, run), so preprocessing, outputs, checks and results are the
same code.

create_session() walks the providers asked for in order: runs of ONNX Runtime providers go
to ort_session (which checks them as before), OpenVINO names come here; the first engine
that is active runs, a later one warns, and none is a ProviderError that gives every
reason. Torch-free; a leaf like the rest of runtime/.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.runtime.contract import (BATCH_DIM, GRID_H_DIM, GRID_W_DIM, HEIGHT_DIM,
                                         WIDTH_DIM)
from vit_deploy.runtime.ort_session import RuntimeOptions, _create_session
from vit_deploy.runtime.providers import (CPU, OPENVINO, OPENVINO_INSTALL, Provider,
                                          ProviderError, available, import_openvino_quietly,
                                          is_openvino, openvino_device, openvino_lists,
                                          openvino_version, short_name)

# What OpenVINO is told at compile time, where the device takes it (_compile_config).
PERFORMANCE_HINT = "LATENCY"  # one stream: a call runs on every thread, as ORT's does
# what is not int8 runs in RuntimeOptions.float_precision: f32 (as ONNX Runtime) by default
# static_shapes (RuntimeOptions): how many shapes keep a model compiled for them, and the
# choice per device where the options leave it to us (measured: docs/cpu-speed.md)
STATIC_SHAPES_KEPT = 8
STATIC_SHAPES_DEFAULT = {"CPU": True}
# Names of dynamic dims by position (OpenVINO keeps no dim_param names): the contract's
_INPUT_DIMS = (BATCH_DIM, "channels", HEIGHT_DIM, WIDTH_DIM)
_GRID_DIMS = (BATCH_DIM, "width", GRID_H_DIM, GRID_W_DIM)  # patch_tokens, layer_N


@dataclass(frozen=True)
class Port:
    """An input or output as ORT's NodeArg gives it: name, shape (dynamic dims as names)."""

    name: str
    shape: list[int | str]
    type: str = "tensor(float)"


@dataclass(frozen=True)
class ModelMeta:
    """ORT's ModelMetadata's one field that ViTSession reads: the file's metadata_props."""

    custom_metadata_map: dict[str, str] = field(default_factory=dict)


class OpenVINOSession:
    """A model compiled by OpenVINO for one device. Safe to share between threads: each
    call takes an idle infer request from a pool (one is made when none is idle), and its
    outputs are copied out before the request goes back."""

    def __init__(self, path: Path, device: str, options: RuntimeOptions) -> None:
        ov = _import_openvino(f"{OPENVINO}{device}")
        self.version: str = openvino_version(ov)
        core = ov.Core()
        devices = list(core.available_devices)
        asked = short_name(f"{OPENVINO}{device}")
        if not openvino_lists(device, devices):
            raise ProviderError(f"provider {asked!r} asked for, but OpenVINO {self.version} "
                                f"lists only the device(s) {devices} here: ask for "
                                f"{[short_name(OPENVINO + d) for d in devices]}")
        if options.float_precision == "bf16":  # where the device would only emulate it
            capabilities = device_capabilities(core, device)
            if "BF16" not in capabilities:  # (OpenVINO 2026 does on AVX-512 without BF16)
                raise ProviderError(
                    f"provider {asked!r}: float_precision bf16 asked for, but OpenVINO "
                    f"{self.version} lists no BF16 among {device}'s capabilities "
                    f"{capabilities} (bf16 needs a CPU with AMX or AVX-512 BF16)")
        try:
            model = core.read_model(str(path))
            config = _compile_config(core, device, options)
            self._compiled = core.compile_model(model, device, config)
        except RuntimeError as e:  # OpenVINO's errors (an op it cannot convert, ...)
            raise ProviderError(f"provider {asked!r}: OpenVINO {self.version} could not "
                                f"compile {str(path)!r} for {device}: "
                                f"{_first_lines(str(e))}") from None
        self.device = device
        self.config = {k: _text(self._compiled.get_property(k)) for k in config}  # as set
        ran = self.config.get("INFERENCE_PRECISION_HINT", "f32")
        if ran != options.float_precision:  # never a silently other precision
            raise ProviderError(f"provider {asked!r}: float_precision {options.float_precision}"
                                f" asked for, but OpenVINO {self.version} compiled {ran} for "
                                f"{device} (bf16 needs a CPU with AMX or AVX-512 BF16)")
        self._meta = ModelMeta(_metadata(model))
        # One compile per input shape (static_shapes): the dynamic model serves until then
        self.static_shapes = (STATIC_SHAPES_DEFAULT.get(device.split(".")[0], False)
                              if options.static_shapes is None else options.static_shapes)
        self._core, self._model, self._compile = core, model, config
        self._by_shape: OrderedDict[tuple, Any] = OrderedDict()
        self._shape_lock = threading.Lock()
        # Names as the file has them (compiling may add some: a cast's at an fp16 output)
        self._inputs = [Port(p.get_any_name(), _shape(p.get_partial_shape(), _INPUT_DIMS))
                        for p in model.inputs]
        self._outputs = [Port(p.get_any_name(), _shape(p.get_partial_shape(), _GRID_DIMS))
                         for p in model.outputs]
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()

    # -- what ViTSession and BucketRunner ask of an ort.InferenceSession ------------------
    def get_providers(self) -> list[str]:
        return [f"{OPENVINO}{self.device}"]

    def get_inputs(self) -> list[Port]:
        return list(self._inputs)

    def get_outputs(self) -> list[Port]:
        return list(self._outputs)

    def get_modelmeta(self) -> ModelMeta:
        return self._meta

    def run(self, output_names: list[str] | None, feed: dict[str, np.ndarray]
            ) -> list[np.ndarray]:
        """Outputs in the graph's order (or `output_names`' order), as numpy arrays."""
        names = [p.name for p in self._inputs]
        if sorted(feed) != sorted(names):
            raise ValueError(f"inputs {sorted(feed)} given; the model takes {names}")
        compiled, idle = self._for_shape(tuple(tuple(np.shape(feed[n])) for n in names))
        try:
            request = idle.get_nowait()
        except queue.Empty:
            request = compiled.create_infer_request()
        try:  # share_inputs: no copy in; share_outputs=False: copies that outlive the request
            result = request.infer({n: feed[n] for n in names}, share_inputs=True,
                                   share_outputs=False)
            outs = {p.name: result[port] for p, port in zip(self._outputs, compiled.outputs)}
        except RuntimeError as e:
            raise RuntimeError(f"OpenVINO ({self.device}) failed to run: "
                               f"{_first_lines(str(e))}") from None
        finally:
            idle.put(request)
        return [outs[n] for n in (output_names or [p.name for p in self._outputs])]

    def _for_shape(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[Any, queue.SimpleQueue]:
        """The compiled model for these input shapes, with its idle requests: the dynamic one,
        or with static_shapes one compiled for exactly these (reshaped: every dim static,
        which OpenVINO's CPU plugin runs faster), the last STATIC_SHAPES_KEPT kept. A shape
        the model cannot take is left to the dynamic model, which says why."""
        if not self.static_shapes:
            return self._compiled, self._idle
        with self._shape_lock:
            if shapes in self._by_shape:
                self._by_shape.move_to_end(shapes)
                return self._by_shape[shapes]
            model = self._model.clone()
            try:
                model.reshape({p.get_any_name(): list(s) for p, s in zip(model.inputs, shapes)})
                compiled = self._core.compile_model(model, self.device, self._compile)
            except RuntimeError:
                return self._compiled, self._idle
            self._by_shape[shapes] = compiled, queue.SimpleQueue()
            if len(self._by_shape) > STATIC_SHAPES_KEPT:
                self._by_shape.popitem(last=False)
            return self._by_shape[shapes]

    def node_names(self) -> list[str]:
        """The compiled graph's layers (OpenVINO runs them all on its device, or fails to
        compile: there is no fallback inside it)."""
        return [op.get_friendly_name() for op in self._compiled.get_runtime_model()
                .get_ordered_ops()]


def _import_openvino(asked: str) -> Any:
    try:
        ov = import_openvino_quietly()
    except ImportError:
        raise ProviderError(f"provider {short_name(asked)!r} asked for, but the openvino "
                            f"package is not installed here ({OPENVINO_INSTALL}); this "
                            f"onnxruntime lists {[short_name(a) for a in available()]}"
                            ) from None
    return ov


def device_capabilities(core: Any, device: str) -> list[str]:
    """The device's OPTIMIZATION_CAPABILITIES ('FP32', 'BF16', 'INT8', ...); [] where its
    plugin does not say (then nothing is assumed of it: bf16 is refused)."""
    try:
        return list(core.get_property(device, "OPTIMIZATION_CAPABILITIES"))
    except RuntimeError:  # "Unsupported property" from a plugin without it
        return []


def _compile_config(core: Any, device: str, options: RuntimeOptions) -> dict[str, Any]:
    """The hint, the precision and the threads, each where `device` supports it (a GPU
    has no thread count; OpenVINO refuses a property its device does not know)."""
    wanted: dict[str, Any] = {"PERFORMANCE_HINT": PERFORMANCE_HINT,
                              "INFERENCE_PRECISION_HINT": options.float_precision}
    if options.threads is not None:
        wanted["INFERENCE_NUM_THREADS"] = options.threads
    supported = set(core.get_property(device, "SUPPORTED_PROPERTIES"))
    return {k: v for k, v in wanted.items() if k in supported}


def _metadata(model: Any) -> dict[str, str]:
    """The ONNX file's metadata_props: OpenVINO keeps them in rt_info['framework']."""
    if not model.has_rt_info(["framework"]):
        return {}
    return {str(k): v.astype(str) for k, v in model.get_rt_info()["framework"].items()}


def _shape(shape: Any, dynamic_names: tuple[str, ...]) -> list[int | str]:
    """OpenVINO's partial shape as ORT gives it: fixed dims as ints, dynamic ones as names
    (the contract's by position in a 4-D shape, the batch first in any, else '?')."""
    if shape.rank.is_dynamic:
        return []
    names = dynamic_names if len(shape) == len(dynamic_names) else (BATCH_DIM,)
    return [d.get_length() if d.is_static else (names[i] if i < len(names) else "?")
            for i, d in enumerate(shape)]


def _text(value: Any) -> str:
    """A compiled model's property as text: 'f32' for OpenVINO's element types."""
    return value.get_type_name() if hasattr(value, "get_type_name") else str(value)


def _first_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[:n])[:400]


# -- the engine along a preference list ---------------------------------------------------
def create_session(path: Path, requested: list[Provider], options: RuntimeOptions,
                   fallback: bool) -> tuple[Any, str | None, bool]:
    """(session, the reason it is not the first choice or None, graph-cache hit) on the
    first engine active among `requested`. Without an OpenVINO name this is exactly
    ort_session's _create_session. With one, each run of consecutive ONNX Runtime
    providers is tried as ort_session tries a list, each OpenVINO device on its own; one
    that cannot run is skipped with its reason, the first that runs is kept (a warning says
    so when it is not the first asked for), and none is a ProviderError giving every
    reason. `fallback` then runs on ONNX Runtime's CPU provider, with a warning."""
    if not any(is_openvino(p.name) for p in requested):
        return _create_session(path, requested, options, fallback)
    reasons: list[str] = []
    for openvino, run in groupby(requested, key=lambda p: is_openvino(p.name)):
        group = list(run)
        for tried in ([[p] for p in group] if openvino else [group]):
            try:
                if openvino:
                    session: Any = OpenVINOSession(path, openvino_device(tried[0].name),
                                                   options)
                    hit = False
                else:
                    with warnings.catch_warnings():  # said once, below, for the whole list
                        warnings.simplefilter("ignore", RuntimeWarning)
                        session, reason, hit = _create_session(path, tried, options, False)
                    if reason:
                        reasons.append(reason)
            except ProviderError as e:
                reasons.append(str(e))
                continue
            return session, _ran_later(session, requested, reasons), hit
    why = "; ".join(reasons)
    if not fallback:
        raise ProviderError(why if len(requested) == 1 else
                            f"none of the providers asked for is active: {why}")
    session, _, hit = _create_session(path, [Provider(CPU)], options, False)
    warnings.warn(f"running on cpu: {why}", RuntimeWarning, stacklevel=3)
    return session, why, hit


def _ran_later(session: Any, requested: list[Provider], reasons: list[str]) -> str | None:
    """The reason the session is not on the first choice (warned), or None."""
    ran = session.get_providers()[0]
    if not reasons:
        return None
    why = "; ".join(reasons)
    if ran != requested[0].name:
        warnings.warn(f"running on {short_name(ran)} (the next in your order of preference): "
                      f"{why}", RuntimeWarning, stacklevel=4)
    return why
