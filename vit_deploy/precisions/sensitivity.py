"""--max-drop and --smooth without the recipe search: the smoothing alpha chosen on the
calibration images, and the most sensitive linear layers kept float until the drop is within
budget. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from vit_deploy.precisions.evaluate import Evaluator
from vit_deploy.precisions.quantize import QuantOptions, quantisable_layers, quantize_model

# The smoothing strengths `--smooth auto` tries with --max-drop (None: unsmoothed), on the
# calibration images; without it the recipe search (search.py) chooses
SMOOTH_ALPHAS = (None, 0.5, 0.75)


def choose_smoothing(evaluator: Evaluator, precision: str, quant: QuantOptions,
                     calibration: Sequence[np.ndarray], smooth: str | float, tmp: Path,
                     log: Callable[[str], None]) -> tuple[QuantOptions, dict[str, float]]:
    """The smoothing alpha for an int8 precision: the given one, or with "auto" the one of
    SMOOTH_ALPHAS whose model agrees best with fp32 on the calibration images (the
    judging images stay held out). Ties keep the weaker smoothing. The probes calibrate
    by minmax (ORT's entropy search takes seconds per tensor); the file written uses the
    method asked for."""
    if smooth != "auto":
        return dataclasses.replace(quant, smooth=float(smooth)), {}
    scores: dict[str, float] = {}
    best, best_score = None, -np.inf
    for alpha in SMOOTH_ALPHAS:
        path = tmp / f"probe.smooth.{precision}.onnx"
        quantize_model(evaluator.reference, path, precision=precision, calibration=calibration,
                       options=dataclasses.replace(quant, smooth=alpha, calibration="minmax"))
        score = evaluator.calibration_score(path, calibration).worst
        scores["none" if alpha is None else str(alpha)] = round(score, 6)
        if score > best_score + 1e-6:
            best, best_score = alpha, score
    log(f"{precision}: smoothing alpha {best} (calibration images: "
        + ", ".join(f"{k} {v:.5f}" for k, v in scores.items()) + ")")
    return dataclasses.replace(quant, smooth=best), scores


def choose_exclusions(evaluator: Evaluator, precision: str, quant: QuantOptions,
                      calibration: Sequence[np.ndarray] | None, max_drop: float, tmp: Path,
                      log: Callable[[str], None]) -> tuple[QuantOptions, list[dict[str, Any]]]:
    """Keep the most sensitive linear layers in float until the drop is within budget."""
    def drop_with(exclude: tuple[str, ...]) -> float:
        path = tmp / f"probe.{precision}.onnx"
        quantize_model(evaluator.reference, path, precision=precision, calibration=calibration,
                       options=dataclasses.replace(quant, exclude=exclude))
        return evaluator.drop(path, precision)

    base = tuple(quant.exclude)
    total = drop_with(base)
    if total <= max_drop:
        return quant, [{"layer": "(all quantised)", "drop": round(total, 6), "kept_float": False}]
    model = onnx.load(str(evaluator.reference), load_external_data=False)
    layers = [p for p in quantisable_layers(model, head=quant.head) if p not in base]
    alone = {}
    for layer in layers:  # quantise one layer at a time: the error it adds on its own
        alone[layer] = drop_with(tuple(p for p in layers if p != layer) + base)
    ranked = sorted(layers, key=lambda p: -alone[p])
    excluded = list(base)
    ranking = []
    for layer in ranked:
        if total <= max_drop:
            break
        if len(excluded) == len(base) + len(layers) - 1:
            raise ValueError(f"--max-drop {max_drop} cannot be met for {precision}: with only "
                             f"{layer} quantised the drop is still {total:.4g}")
        excluded.append(layer)
        total = drop_with(tuple(excluded))
        ranking.append({"layer": layer, "drop_alone": round(alone[layer], 6), "kept_float": True,
                        "drop_after": round(total, 6)})
        log(f"{precision}: keeping {layer} in float (alone it costs {alone[layer]:.4g}); "
            f"now {total:.4g}")
    ranking += [{"layer": p, "drop_alone": round(alone[p], 6), "kept_float": False}
                for p in ranked if p not in excluded]
    return dataclasses.replace(quant, exclude=tuple(excluded)), ranking
