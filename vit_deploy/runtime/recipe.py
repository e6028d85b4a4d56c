"""The int8 recipe of a bundle's quantised file, as one typed value.

`quantize` writes it into the manifest (`precisions.<p>.recipe`), `target` reads it back to
quantise bucket graphs the same way, and the runtime (Python here, JavaScript in
web/src/lib/manifest.mjs `int8Recipe`) reads which CPUs the file is exact on. Every reader
goes through `Int8Recipe.read`; the writer through `Int8Recipe.record`. The recipe also
holds descriptive text (weights, kept-float operators, node count) that only people read.

A manifest edited by hand or written by an older version may lack a field or hold a value
we do not know: `read` never raises; an unknown value reads as "not stated" (None), and the
two questions asked of an unstated CPU are answered on the safe side for each: the warning
assumes 8-bit weights (`needs` = vnni), a new graph gets portable 7-bit weights
(`new_graph_cpu` = any).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vit_deploy.runtime.cpu import ANY_CPU, INT8_CPUS, VNNI_CPU

INT8_KINDS = ("dynamic", "static QDQ")  # int8, int8-static
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")


@dataclass(frozen=True, kw_only=True)
class Int8Recipe:
    kind: str  # one of INT8_KINDS
    # The CPUs the file is exact on (runtime/cpu.py): 'any' (7-bit weights) or 'vnni'
    # (8-bit weights); None where the manifest does not say (or says something unknown).
    cpu: str | None = None
    calibration: str | None = None  # static: minmax | entropy | percentile
    percentile: float | None = None  # static, calibration == "percentile"
    smoothing: float | None = None  # SmoothQuant alpha folded into the graph (precisions/smooth.py)
    quantised_layers: tuple[str, ...] = ()  # module paths, e.g. "blocks.0.attn.qkv"
    kept_float_layers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in INT8_KINDS:
            raise ValueError(f"int8 recipe kind must be one of {INT8_KINDS}, got {self.kind!r}")
        if self.cpu is not None and self.cpu not in INT8_CPUS:
            raise ValueError(f"int8 CPU must be one of {INT8_CPUS}, got {self.cpu!r}")
        if self.calibration is not None and self.calibration not in CALIBRATION_METHODS:
            raise ValueError(f"calibration must be one of {CALIBRATION_METHODS}, got "
                             f"{self.calibration!r}")
        if self.smoothing is not None and not 0.0 <= self.smoothing <= 1.0:
            raise ValueError(f"smoothing alpha must be within [0, 1], got {self.smoothing!r}")

    @property
    def static(self) -> bool:
        return self.kind == "static QDQ"

    @property
    def reduce_range(self) -> bool:
        """7-bit weights (ORT's reduce_range)."""
        return self.cpu == ANY_CPU

    @property
    def needs(self) -> str:
        """The CPUs the file is exact on, for the warning: unstated reads as 8-bit weights."""
        return self.cpu or VNNI_CPU

    @property
    def new_graph_cpu(self) -> str:
        """The CPUs a graph quantised after this recipe must be exact on: 8-bit weights only
        where the recipe says 'vnni' in so many words."""
        return VNNI_CPU if self.cpu == VNNI_CPU else ANY_CPU

    @classmethod
    def read(cls, recipe: Any) -> Int8Recipe | None:
        """The typed recipe of a manifest's `recipe` object; None unless it is int8."""
        if not isinstance(recipe, Mapping) or recipe.get("kind") not in INT8_KINDS:
            return None
        cpu = recipe.get("cpu")
        if cpu not in INT8_CPUS:  # older files said only reduce_range
            cpu = ANY_CPU if cpu is None and recipe.get("reduce_range") is True else None
        method = recipe.get("calibration")
        smoothing = recipe.get("smoothing")
        alpha = smoothing.get("alpha") if isinstance(smoothing, Mapping) else None
        percentile = recipe.get("percentile")
        return cls(kind=recipe["kind"], cpu=cpu,
                   calibration=method if method in CALIBRATION_METHODS else None,
                   percentile=float(percentile) if _number(percentile) and 0 < percentile <= 100
                   else None,
                   smoothing=float(alpha) if _number(alpha) and 0 <= alpha <= 1 else None,
                   quantised_layers=_names(recipe.get("quantised_layers")),
                   kept_float_layers=_names(recipe.get("kept_float_layers")))

    def record(self) -> dict[str, Any]:
        """The manifest fields this value owns (`read(record())` gives it back)."""
        out: dict[str, Any] = {"kind": self.kind, "quantised_layers": list(self.quantised_layers),
                               "kept_float_layers": list(self.kept_float_layers),
                               "reduce_range": self.reduce_range}
        if self.cpu is not None:
            out["cpu"] = self.cpu
        if self.calibration is not None:
            out["calibration"] = self.calibration
        if self.percentile is not None:
            out["percentile"] = self.percentile
        if self.smoothing is not None:
            out["smoothing"] = {"alpha": self.smoothing}
        return out


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def _names(x: Any) -> tuple[str, ...]:
    return tuple(s for s in x if isinstance(s, str)) if isinstance(x, (list, tuple)) else ()
