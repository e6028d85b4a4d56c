"""What `vit-deploy info` shows of a bundle: the manifest, rendered (rich)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vit_deploy.runtime.contract import model_role
from vit_deploy.runtime.manifest import Manifest
from vit_deploy.runtime.manifest_parts import is_finite_number
from vit_deploy.runtime.sizes import format_resolution


@dataclass(frozen=True)
class BundleSummary:
    manifest: Manifest
    path: str

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.filesize import decimal
        from rich.table import Table

        m, cfg, io = self.manifest, self.manifest.config, self.manifest.io
        lines: list[Any] = [
            f"bundle {self.path}: {cfg.name or 'ViT'} width {cfg.width} depth {cfg.depth} "
            f"heads {cfg.heads} patch {cfg.patch_size}, native "
            f"{format_resolution(cfg.img_size)}, {cfg.num_classes} classes"
            + (f", patch embedding PI-resized from {cfg.trained_patch_size} (FlexiViT)"
               if cfg.trained_patch_size else "")
            + (f", token merging {list(cfg.merge)} per block (ToMe)" if cfg.merging else ""),
            ", ".join(f"input {i.name} {list(i.shape)} {i.dtype}" for i in
                      (io.inputs if m.naflex else io.inputs[:1]))
            + (f" ({io.dim_rule})" if io.dim_rule else " (static)")
            + "; outputs " + ", ".join(f"{o.name} {list(o.shape)}" for o in io.outputs)
            + (f"; preprocessing NaFlex: each image at its own aspect ratio, at most "
               f"{m.preprocess.max_num_patches} patches" if m.naflex else
               f"; preprocessing {m.preprocess.resize} to "
               f"{format_resolution(m.deploy_resolution)}"),
            _purpose_line(m)]
        table = Table("file", "role", "size", "nodes", "sha256")
        for name, entry in m.files.items():
            precision = entry.role.removeprefix("model:")
            nodes = m.recipe(precision).get("nodes") or (
                m.export.get("nodes", "") if entry.role == model_role("fp32") else "")
            table.add_row(name, entry.role, decimal(entry.size), str(nodes), entry.sha256[:12])
        lines.append(table)
        simp = m.export.get("simplify")
        if isinstance(simp, Mapping) and simp.get("requested"):
            lines.append(f"onnxsim: {simp.get('nodes_before')} -> {simp.get('nodes_after', '?')} "
                         f"nodes, {'kept' if simp.get('kept') else 'discarded'}")
        lines += _parity_line(m.parity)
        lines += _int8_cpu_lines(m)
        if "total_s" in m.export:
            lines.append(f"export took {m.export['total_s']} s (torch.onnx.export "
                         f"{m.export.get('export_s', '?')} s)")
        for t in m.targets.values():
            graphs = t.record.get("graphs") if isinstance(t.record, Mapping) else None
            cosines = [g["parity"]["cosine"] for g in graphs or [] if isinstance(g, Mapping)
                       and isinstance(g.get("parity"), Mapping) and g.get("passed")
                       and is_finite_number(g["parity"].get("cosine"))]
            lines.append(f"target {t.name}: batch {t.batch}, buckets "
                         f"{[format_resolution(r) for r in t.resolutions]}, {list(t.precisions)}, "
                         f"policy {t.policy}; {len(t.graphs)} graph(s)"
                         + (f", min cosine vs PyTorch {min(cosines):.6f}" if cosines else "")
                         + (", ORT format with " + t.required_operators if t.required_operators
                            else ""))
            lines += mobile_lines(t.record.get("mobile_check"))
        return Group(*lines)


def _purpose_line(m: Manifest) -> str:
    p = m.purpose
    said = {"classifier": f"classifies ({p.classifier}"
                          + (f", {len(m.labels)} labels)" if m.labels else ", no labels)"),
            "embedding": f"embeds ({p.embedding}"
                         + (f", {p.dim} wide" if p.dim else "")
                         + f", {p.similarity}" + (", unit length" if p.normalised else "") + ")"}
    parts = [said[k] for k in ("classifier", "embedding") if getattr(p, k)]
    return "purpose: " + (" and ".join(parts) if parts else "features only (no classifier, "
                                                           "no one-vector-per-image output)")


def mobile_lines(check: Any) -> list[str]:
    """ORT's mobile checker's verdicts, as `vit-deploy target` stores them, one line per
    graph checked and execution provider."""
    if not isinstance(check, Mapping):
        return []
    out = []
    for which, eps in check.items():
        if not isinstance(eps, Mapping):
            continue
        for ep, v in eps.items():
            try:
                out.append(f"  ORT mobile checker, {which}: {ep} {v['supported_nodes']}/"
                           f"{v['nodes']} nodes in {v['partitions']} partition(s), verdict "
                           f"{v['verdict']}" + (f"; unsupported ops {list(v['unsupported_ops'])}"
                                                if v.get("unsupported_ops") else ""))
            except (KeyError, TypeError):
                continue
    return out


def _int8_cpu_lines(m: Manifest) -> list[str]:
    """Per int8 precision: the CPUs it is exact on, and whether this one is."""
    from vit_deploy.runtime.cpu import REQUIREMENT_TEXT, int8_kernel, meets

    lines = []
    for precision in m.models:
        need = m.int8_cpu(precision)
        if need is not None:
            ok = meets(need)
            lines.append(f"{precision}: exact on {REQUIREMENT_TEXT[need]}; this CPU: "
                         f"{int8_kernel()}" + ("" if ok else " - NOT exact here" if ok is False
                                               else " - cannot tell"))
    return lines


def _parity_line(parity: Mapping[str, Any]) -> list[str]:
    """One line over the export's parity record, if it has the shape we write."""
    cases = parity.get("cases")
    try:
        worst = max(float(c["max_abs"]) for c in cases)
        cos = min(float(c["cosine"]) for c in cases)
        providers = sorted({str(c["provider"]) for c in cases})
    except (KeyError, TypeError, ValueError):  # no cases, or not the shape we write
        return []
    return [f"parity: {'PASS' if parity.get('passed') else 'FAIL'} on {len(providers)} "
            f"provider(s) {providers}, {len(cases)} cases, worst max|Δ| {worst:.2e}, min "
            f"cosine {cos:.7f}"]
