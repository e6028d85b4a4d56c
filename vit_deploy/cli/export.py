"""`vit-deploy export`: a checkpoint (or random weights) to a checked ONNX bundle."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from vit_deploy.cli.options import console, force_option, quant_options, quiet_option
from vit_deploy.cli.params import MAX_PATCH, MAX_SEED, RESOLUTION, PrecisionList
from vit_deploy.cli.quant_flags import add_precisions, refuse_for_naflex
from vit_deploy.runtime.config import POOLS, POS_EMBED_KINDS, VARIANTS
from vit_deploy.runtime.contract import OPSET
from vit_deploy.runtime.sizes import format_resolution


def hf_model_types() -> str:
    """The config.json model_types the checkpoint registry reads (export/checkpoints/hf.py,
    FAMILIES), in its order: read when --checkpoint's help is shown, never on import."""
    try:
        from vit_deploy.export.checkpoints.hf import FAMILIES
    except ImportError:  # the runtime alone, without the export extra (torch)
        return "those of docs/checkpoints.md (needs the export extra)"
    return ", ".join(t for f in FAMILIES for t in f.model_types)


class FamiliesOption(click.Option):
    """An option whose help says {model_types} where the registry's list goes (hf_model_types),
    filled in as the help is shown, so that loading the command imports no torch
    (tests/cli/test_cli_lazy.py) and a new family is named without editing this file."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        template = self.help or ""
        self.help = template.replace("{model_types}", hf_model_types())
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = template


@click.command()
@click.option("--model", "variant_name", default=None, metavar="SIZE[/PATCH]",
              help=f"Model size ({', '.join(VARIANTS)}), optionally with /PATCH (B/16). "
                   "Default B. With a --checkpoint, a size other than the checkpoint's is "
                   "an error.")
@click.option("--patch", type=click.IntRange(min=1, max=MAX_PATCH), default=None,
              help="Patch size (8, 14, 16, 32 for the named sizes). Default 16 (tiny: 8). "
                   "With a --checkpoint of another patch size, its patch embedding is "
                   "PI-resized (FlexiViT) and its position table resampled.")
@click.option("--res", "resolution", type=RESOLUTION, default=None,
              help="Deploy resolution, N or HxW: parity is checked there and preprocessing "
                   "resizes to it. Default: the native resolution.")
@click.option("--native-res", type=RESOLUTION, default=None,
              help="Native resolution of a newly built model (its position table). Default 224.")
@click.option("--checkpoint", cls=FamiliesOption, default=None,
              metavar="PATH|hf:ORG/NAME[@REV]|timm:NAME[@REV]",
              help="Weights: a vit-deploy .safetensors (carries its config), a timm state dict "
                   "(.safetensors / .pth / .bin), a Hugging Face directory whose config.json "
                   "model_type is one of {model_types} (docs/checkpoints.md), or a hub name "
                   "(hf:ORG/NAME[@REVISION], timm:NAME[@REVISION]) fetched through "
                   "huggingface_hub's cache (HF_HUB_OFFLINE=1: the cache only). A "
                   "checkpoint's own preprocessing and class names come along. Default: "
                   "random weights (seeded).")
@click.option("--from", "source", type=click.Choice(["auto", "vit-deploy", "timm", "hf"]),
              default="auto", show_default=True, help="Checkpoint format.")
@click.option("--heads", type=click.IntRange(1, 1024), default=None,
              help="Attention heads of a timm checkpoint of non-standard width.")
@click.option("--pos-embed", type=click.Choice(POS_EMBED_KINDS), default="learned",
              show_default=True, help="Position encoding of a newly built model (a "
              "checkpoint brings its own): learned, one table resampled to each size; "
              "factorized, row and column tables; rope, 2-D rotary, no table.")
@click.option("--pool", type=click.Choice(POOLS), default="cls", show_default=True,
              help="Pooling of a newly built model (a checkpoint brings its own): cls, the "
                   "class token; mean, the mean patch token; map, attention pooling with a "
                   "learned probe.")
@click.option("--num-classes", type=click.IntRange(0, 1_000_000), default=None,
              help="Classes of the head; 0: a backbone without one. Default 1000 (tiny: 10).")
@click.option("--static", is_flag=True, help="Freeze --res into the graph (no Resize node).")
@click.option("--no-simplify", is_flag=True, help="Skip onnxsim.")
@click.option("--features", is_flag=True, hidden=True,
              deprecated="use --outputs logits,pooled (predict's --features names a file)",
              help="Also output the pooled features: --outputs logits,pooled.")
@click.option("--outputs", "outputs", default=None, metavar="NAMES",
              help="Comma-separated outputs, in order: logits, pooled, patch_tokens "
                   "[batch, width, grid_h, grid_w], class_token, register_tokens. Default: "
                   "logits (a model without classifier: pooled,patch_tokens).")
@click.option("--layers", default=None, metavar="BLOCKS",
              help="Also output the patch tokens after these blocks (1-based, e.g. 3,6,9,12) "
                   "as layer_N [batch, width, grid_h, grid_w], for DPT-style heads.")
@click.option("--merge-tokens", "merge", default=None, metavar="R|r1,r2,...",
              help="Token merging (ToMe) in the graph: merge R tokens in every block, or one "
                   "number per block. Faster, slightly less exact; classifier outputs only.")
@click.option("--layer-norm/--no-layer-norm", default=True, show_default=True,
              help="Pass --layers through the final norm (DINOv2 / Dinov2Backbone) or not "
                   "(Hugging Face hidden_states).")
@click.option("--opset", type=click.IntRange(18, 30), default=OPSET, show_default=True,
              help="ONNX opset of the graph, 18 to 30.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="Seed of random weights.")
@click.option("--out", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Bundle directory. Default: ./vit-<model><patch>-<res>.")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Class names, one per line (as many as classes).")
@click.option("--zero-shot", "zero_shot", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="LABELS",
              help="CLIP / SigLIP: classify with these labels (one per line): the checkpoint's "
                   "text tower embeds each label's prompt once, here, and the bundle keeps the "
                   "label embeddings as its classifier (needs transformers and a checkpoint "
                   "with its text tower and tokenizer).")
@click.option("--prompt", default=None, metavar="TEMPLATE",
              help="With --zero-shot: each label's prompt, {} where the label goes. Default: "
                   "\"This is a photo of {}.\" (transformers' zero-shot pipeline).")
@click.option("--naflex", is_flag=True, help="SigLIP 2 NaFlex: a bundle whose graph takes "
              "each image at its own aspect ratio (patches + mask + grids, as "
              "Siglip2ImageProcessor makes them). Needs a siglip2 --checkpoint; no --res, "
              "--static or output options.")
@click.option("--max-patches", "max_patches", type=click.IntRange(1, 65_536), default=None,
              help="With --naflex: each image's patch budget (max_num_patches). Default: the "
                   "checkpoint processor's max_num_patches, else 256.")
@click.option("--precision", "precisions", type=PrecisionList(), default="fp32",
              show_default=True, help="Precisions to add after the fp32 export (see quantize).")
@quant_options
@force_option("Write into --out even if vit-deploy did not write it (its files are "
              "kept), and try resolutions whose memory estimate exceeds what is available.")
@quiet_option("only the bundle's path, once written")
def export(variant_name: str | None, patch: int | None, resolution: tuple[int, int] | None,
           native_res: tuple[int, int] | None, checkpoint: str | None, source: str,
           heads: int | None, pos_embed: str, pool: str,
           num_classes: int | None, static: bool, no_simplify: bool, features: bool,
           outputs: str | None, layers: str | None, layer_norm: bool, merge: str | None,
           opset: int, seed: int, out: Path | None, labels_file: Path | None, precisions: tuple[str, ...],
           force: bool, quiet: bool, naflex: bool = False, max_patches: int | None = None,
           zero_shot: Path | None = None, prompt: str | None = None, **quant: Any) -> None:
    """Export a ViT to an ONNX bundle that takes any H×W divisible by the patch size.

    Checks ONNX Runtime (CPU) against PyTorch at several resolutions and batch sizes;
    a failing case fails the export and leaves nothing behind.

    \b
    Example:
      vit-deploy export --model B/16 --res 224 --precision fp32,int8 --out vit-B16-224
      vit-deploy export --checkpoint siglip2-dir --naflex --max-patches 256 --out s2-naflex
    """
    if naflex or max_patches is not None:
        given = {"--res": resolution, "--static": static, "--native-res": native_res,
                 "--patch": patch, "--model": variant_name, "--num-classes": num_classes,
                 "--features": features, "--outputs": outputs, "--layers": layers,
                 "--merge-tokens": merge, "--labels": labels_file, "--zero-shot": zero_shot}
        export_naflex_bundle(checkpoint, out, naflex=naflex, max_patches=max_patches,
                             source=source, opset=opset, precisions=precisions, force=force,
                             quiet=quiet, refused=[k for k, v in given.items() if v], **quant)
        return
    from vit_deploy.export.bundle import (ExportOptions, default_bundle_name, export_bundle,
                                          model_from_flags, validate_request)
    from vit_deploy.export.sources import open_checkpoint
    from vit_deploy.outputs import parse_layers, parse_names
    from vit_deploy.progress import steps
    from vit_deploy.runtime.config import config_from_flags

    check_zero_shot(zero_shot, prompt, checkpoint=checkpoint, labels=labels_file,
                    num_classes=num_classes)
    labels = read_labels(labels_file) if labels_file else None
    src = open_checkpoint(checkpoint, source=source) if checkpoint else None  # hub: fetched
    options = ExportOptions(resolution=resolution, static=static, simplify=not no_simplify,
                            opset=opset, features=features, force=force, labels=labels,
                            allow_large=force, outputs=parse_names(outputs),
                            layers=parse_layers(layers), layer_norm=layer_norm)
    if checkpoint is None:  # the flags give the config: refuse (memory guard) before building
        validate_request(config_from_flags(variant_name or "B", patch=patch, native_res=native_res,
                                           num_classes=num_classes, pos_embed=pos_embed,
                                           pool=pool), options)
    with text_tower_used(zero_shot is not None):
        model, fmt = model_from_flags(variant_name, patch=patch, native_res=native_res,
                                      num_classes=num_classes, pos_embed=pos_embed, pool=pool,
                                      seed=seed, checkpoint=src.path if src else None,
                                      source=src.source if src else source, heads=heads,
                                      merge=merge)
    if src is not None:  # its preprocessing, class names and origin go into the manifest
        refuse_overridden(model.cfg, pool=pool, pos_embed=pos_embed)
        options = src.export_options(model, options)
    if zero_shot is not None and src is not None:
        model, options = add_zero_shot(model, options, src.path, zero_shot, prompt, quiet)
    cfg = model.cfg
    resolution = validate_request(cfg, options)  # fail fast, before minutes of work
    out = out or Path(default_bundle_name(cfg, resolution))
    screen = console()
    if not quiet:
        screen.print(f"{f'checkpoint {checkpoint}: {fmt} format; ' if fmt else ''}exporting "
                     f"{cfg.name or 'ViT'} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}"
                     f" M parameters, {cfg.pos_embed} positions, {cfg.pool} pooling) at "
                     f"{format_resolution(resolution)}, {'static' if static else 'dynamic'} "
                     f"-> {out}")
    with steps(quiet=quiet, title="exporting") as progress:
        result = export_bundle(model, out, options=options, progress=progress)
    _finish(out, result.report, result.notes, precisions, quant, quiet=quiet)


def _finish(out: Path, report: Any, notes: Sequence[str], precisions: tuple[str, ...],
           quant: dict[str, Any], *, quiet: bool) -> None:
    """After either input kind's bundle is written: its parity report and notes, the
    precisions asked for (quantize's step), then the bundle's summary (--quiet: its path)."""
    from vit_deploy.info import BundleSummary
    from vit_deploy.runtime.manifest import load_manifest

    screen = console()
    if not quiet:
        screen.print(report)
    for note in notes:
        if quiet:  # a note is a warning: stderr, beside errors
            click.echo(f"note: {note}", err=True)
        else:
            screen.print(f"note: {note}")
    if any(p != "fp32" for p in precisions):
        add_precisions(out, precisions, force=False, quiet=quiet, **quant)
    if quiet:
        click.echo(str(out))
        return
    screen.print(BundleSummary(load_manifest(out), str(out)))


def refuse_overridden(cfg: Any, **flags: str) -> None:
    """--pool / --pos-embed build a new model; a checkpoint brings its own. Given on the
    command line with a checkpoint whose own differs, they were silently not applied: now
    a usage error naming both (the same value is accepted)."""
    ctx = click.get_current_context()
    for name, value in flags.items():
        given = ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        own = getattr(cfg, name)
        if given and value != own:
            flag = f"--{name.replace('_', '-')}"
            raise click.UsageError(f"{flag} {value}: the checkpoint brings its own ({own}); "
                                   f"{flag} applies to a newly built model only: drop it")


def check_zero_shot(zero_shot: Path | None, prompt: str | None, *, checkpoint: str | None,
                    labels: Path | None, num_classes: int | None) -> None:
    """--zero-shot's usage errors, before anything is loaded."""
    if zero_shot is None:
        if prompt is not None:
            raise click.UsageError("--prompt is the zero-shot labels' template: it needs "
                                   "--zero-shot LABELS")
        return
    clash = [f for f, v in (("--labels", labels), ("--num-classes", num_classes)) if v]
    if clash:
        raise click.UsageError(f"--zero-shot makes the classifier from its labels: drop "
                               f"{' and '.join(clash)}")
    if checkpoint is None:
        raise click.UsageError("--zero-shot needs a CLIP or SigLIP --checkpoint with its text "
                               "tower (a CLIPModel / SiglipModel save_pretrained folder)")


def add_zero_shot(model: Any, options: Any, directory: Path, labels_file: Path,
                  prompt: str | None, quiet: bool) -> tuple[Any, Any]:
    """The model with the labels' zero-shot head, the options that record it."""
    import dataclasses

    from vit_deploy.export.zero_shot import read_labels as read_zero_shot, with_zero_shot, \
        zero_shot_head

    try:
        labels = read_zero_shot(labels_file)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--zero-shot") from None
    try:
        head = zero_shot_head(directory, labels, prompt)
    except ValueError as e:  # the template
        raise click.BadParameter(str(e), param_hint="--prompt") from None
    if not quiet:
        console().print(f"zero-shot: {len(labels)} label(s) embedded by the checkpoint's text "
                        f"tower ({head.model_type}, prompt {head.template!r}, "
                        f"{head.probabilities})")
    source = {**(options.source or {}), "zero_shot": head.record()}
    outputs = options.outputs or ("logits", "pooled")  # it classifies and embeds
    return with_zero_shot(model, head), dataclasses.replace(
        options, labels=head.labels, probabilities=head.probabilities, source=source,
        outputs=outputs)


def read_labels(path: Path) -> tuple[str, ...]:
    """--labels: the zero-shot reader's rules, but a name may repeat (ImageNet's do)."""
    from vit_deploy.export.zero_shot import read_labels as read_label_file

    try:
        return read_label_file(path, unique=False)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--labels") from None


@contextlib.contextmanager
def text_tower_used(active: bool) -> Iterator[None]:
    """With --zero-shot, the checkpoint's text tower is what the labels are embedded with:
    the loader's CheckpointWarning no longer calls those tensors "not used" (the rest, a
    pooler, say, are still named)."""
    if not active:
        yield
        return
    from vit_deploy.export.checkpoints import CheckpointWarning
    from vit_deploy.export.zero_shot import uses_tensor

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        message = w.message
        if isinstance(message, CheckpointWarning) and message.tensors:
            rest = [t for t in message.tensors if not uses_tensor(t)]
            if not rest:
                continue
            if len(rest) < len(message.tensors):
                message = CheckpointWarning.unused(message.where, tuple(rest))
        warnings.warn_explicit(message, w.category, w.filename, w.lineno)


def export_naflex_bundle(checkpoint: str | None, out: Path | None, *, naflex: bool,
                         max_patches: int | None, source: str, opset: int,
                         precisions: tuple[str, ...], force: bool, quiet: bool,
                         refused: list[str], **quant: Any) -> None:
    """`export --naflex`: refuse what NaFlex cannot take, then export_naflex_bundle."""
    if not naflex:
        raise click.UsageError("--max-patches is NaFlex's patch budget: it needs --naflex")
    if refused:
        raise click.UsageError(f"--naflex takes each image at its own aspect ratio and "
                               f"outputs pooled + last_hidden_state: {', '.join(refused)} "
                               f"cannot apply; drop {'it' if len(refused) == 1 else 'them'}")
    if checkpoint is None:
        raise click.UsageError("--naflex needs a SigLIP 2 --checkpoint (a siglip2 "
                               "save_pretrained directory or hf:ORG/NAME)")
    refuse_for_naflex(precisions, **quant)  # before anything is written
    from vit_deploy.export.naflex.bundle import (NaFlexBundleOptions, export_naflex_bundle as
                                                 write_bundle, siglip2_checkpoint)
    from vit_deploy.export.sources import open_checkpoint
    from vit_deploy.progress import steps

    src = open_checkpoint(checkpoint, source=source)
    model = siglip2_checkpoint(src.path, source=src.source)  # UsageError-worthy: exit 2
    pre = src.preprocess
    if pre is not None and pre.patch_size not in (None, model.cfg.patch_size):
        raise click.UsageError(f"{pre.origin}: patch_size {pre.patch_size}, but the model's "
                               f"patch embedding is {model.cfg.patch_size}")
    # the budget: --max-patches, else the checkpoint's processor's, else SigLIP 2's 256
    max_patches = max_patches or (pre.max_num_patches if pre else None) or 256
    out = out or Path(f"siglip2-naflex-{max_patches}")
    options = NaFlexBundleOptions(max_num_patches=max_patches, opset=opset, force=force,
                                  mean=pre.mean if pre else None, std=pre.std if pre else None,
                                  source={**src.manifest_record(0), "checkpoint": src.name})
    screen = console()
    if not quiet:
        screen.print(f"exporting {model.cfg.name or 'SigLIP 2'} as NaFlex (at most "
                     f"{options.max_num_patches} patches per image) -> {out}")
    with steps(quiet=quiet, title="exporting") as progress:
        result = write_bundle(model, out, options=options, progress=progress)
    _finish(out, result.report, (), precisions, quant, quiet=quiet)
