"""What a session's outputs become: predictions (the top k with their labels), softmax, and
the checks that an output is a result (no NaN / Inf; one label per class)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError
from vit_deploy.runtime.manifest_parts import BundleError

class OutputError(VitDeployError, ValueError):
    """A model output that is no result (NaN or ±Inf): says which output and how many."""

    exit_code = BAD_INPUT


@dataclass(frozen=True)
class Classified:
    index: int
    label: str | None
    probability: float


@dataclass(frozen=True)
class Prediction:
    source: str  # what was given: a path, or a description of the object
    input_size: tuple[int, int]  # (H, W) the model saw
    top: list[Classified]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "input_size": list(self.input_size),
                "top": [c.__dict__ for c in self.top]}

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table("rank", "class", "label", "probability", title=f"{self.source} "
                      f"({self.input_size[0]}x{self.input_size[1]})", title_justify="left")
        for rank, c in enumerate(self.top, 1):
            table.add_row(str(rank), str(c.index), c.label or "", f"{c.probability:.4f}")
        return table

def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def probabilities(logits: np.ndarray, rule: str = "softmax") -> np.ndarray:
    """A classifier's logits read as its purpose says (purpose.PROBABILITIES): softmax over
    the classes, or each class's sigmoid (SigLIP: each label judged on its own)."""
    if rule == "sigmoid":
        return 0.5 * (1.0 + np.tanh(0.5 * logits.astype(np.float64)))  # no overflow at -1000
    if rule != "softmax":
        raise ValueError(f"probabilities must be softmax or sigmoid, got {rule!r}")
    return softmax(logits)


def require_finite(values: np.ndarray, name: str) -> np.ndarray:
    """`values`, or an OutputError when the model produced NaN or ±Inf there: such numbers
    are no result (softmax turns them into NaN probabilities) and are never returned as one."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise OutputError(f"the model's output {name!r} holds {int(bad.sum())} NaN/Inf "
                          f"value(s) of {values.size}: no usable result (a broken model, "
                          f"or preprocessing values that overflow it)")
    return values


def _check_labels(labels: tuple[str, ...], width: int, output: str, path: Path) -> None:
    if len(labels) != width:
        raise BundleError(f"the manifest has {len(labels)} labels, but the model's output "
                          f"{output!r} in {str(path)!r} has {width} classes; expected one "
                          f"label per class")
