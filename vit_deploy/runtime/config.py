"""ViT configuration: one frozen dataclass, named variants, JSON round-trip."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

POS_EMBED_KINDS = ("learned", "factorized", "rope")  # rope: 2-D rotary, no table (DINOv3)
POOLS = ("cls", "mean", "map")  # map: attention pooling with a learned probe (SigLIP)
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "silu")  # erf GELU, tanh GELU, CLIP's, SiLU
# plain: fc2(act(fc1 x)); gated: fc2(act(gate x) * up x), SwiGLU with act silu (DINOv3 H+ / 7B)
MLPS = ("plain", "gated")
INTERP_MODES = ("bicubic", "bilinear")
PATCH_SIZES = (8, 14, 16, 32)

# Width / depth / heads per model size. Source: Dosovitskiy et al. 2021, Table 1
# (B, L), Touvron et al. 2021 (DeiT: Ti, S). MLP ratio 4 for all.
# `tiny` is ours: small enough that tests export it in a second or two.
VARIANTS: dict[str, dict[str, int]] = {
    "Ti": dict(width=192, depth=12, heads=3),
    "S": dict(width=384, depth=12, heads=6),
    "B": dict(width=768, depth=12, heads=12),
    "L": dict(width=1024, depth=24, heads=16),
    "tiny": dict(width=48, depth=2, heads=3),
}

# ImageNet statistics: what timm / torchvision ViTs were trained with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Bounds on what preprocessing computes with, (pixel * scale - mean) / std, wherever it
# comes from (a manifest, a checkpoint, a flag): any 8-bit pixel then gives a finite
# float32 of at most (255 * MAX_SCALE + MAX_ABS_MEAN) / MIN_STD ≈ 2.6e11. Real values sit
# far inside: mean 0..1 (0..255 with scale 1), std 0.2..80, scale 1/255 or 1.
MAX_ABS_MEAN = 1e4
MIN_STD, MAX_STD = 1e-6, 1e4  # below MIN_STD a pixel is multiplied by > 1e6
MIN_SCALE, MAX_SCALE = 1e-6, 1e3


def check_normalization(mean: Any, std: Any, *, channels: int | None = None,
                        scale: Any = None, what: str = "") -> None:
    """ValueError, naming `what` + the field, what was expected and what was given, unless
    mean and std are `channels` (default: as many as each other, 1 or more) real numbers
    within the bounds above, and `scale` (if given) too. The one validator for the
    manifest, the config, checkpoints, the runtime's Preprocess and the CLI's flags."""
    if (channels is None and isinstance(mean, (list, tuple)) and isinstance(std, (list, tuple))
            and len(mean) != len(std)):
        raise ValueError(f"{what}mean and {what}std must have as many values (one per "
                         f"channel), got {len(mean)} and {len(std)}")
    n = channels
    for name, values, low, high in (("mean", mean, -MAX_ABS_MEAN, MAX_ABS_MEAN),
                                    ("std", std, MIN_STD, MAX_STD)):
        count = f"{n} " if n is not None else ""
        if not (isinstance(values, (list, tuple)) and values
                and (n is None or len(values) == n)
                and all(_is_real(v) and low <= v <= high for v in values)):
            raise ValueError(f"{what}{name} must be {count}finite numbers from {low:g} to "
                             f"{high:g}, got {_show(values)}")
        n = len(values)
    if scale is not None and not (_is_real(scale) and MIN_SCALE <= scale <= MAX_SCALE):
        raise ValueError(f"{what}scale must be a finite number from {MIN_SCALE:g} to "
                         f"{MAX_SCALE:g}, got {_show(scale)}")


def _is_real(v: Any) -> bool:
    """An int or float that is finite (False for bools, NaN, ±Inf, strings)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _show(value: Any) -> str:
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True, kw_only=True)
class ViTConfig:
    """Everything needed to rebuild the model; serialised into every bundle."""

    img_size: tuple[int, int] = (224, 224)  # native (H, W): the position table's grid × patch
    patch_size: int = 16
    in_chans: int = 3
    width: int = 768
    depth: int = 12
    heads: int = 12
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    pos_embed: str = "learned"  # learned | factorized
    pool: str = "cls"  # cls | mean (mean averages the patch tokens only)
    class_token: bool = True
    dist_token: bool = False  # DeiT's distillation token (a second prefix token)
    dist_head: bool = True  # with dist_token: average the cls and distillation heads (DeiT)
    num_registers: int = 0  # DINOv2 register tokens, after cls/dist, before the patches
    pos_prefix_tokens: int | None = None  # prefix tokens with a position row; None: cls+dist
    layer_scale: bool = False  # per-channel scale on each residual branch (DINOv2, DeiT-3)
    fc_norm: bool = False  # final LayerNorm after pooling instead of on the tokens (timm avg)
    pos_interp: str = "bicubic"  # how the position table is resampled to another grid
    pos_antialias: bool = False  # timm: True; Hugging Face ViT: False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    # Token merging (ToMe): tokens merged in each block, one number per block; () none.
    merge: tuple[int, ...] = ()
    # The patch size the weights were trained at, when the kernel was PI-resized (FlexiViT)
    # to patch_size at export; None: trained at patch_size.
    trained_patch_size: int | None = None
    # Families beyond ViT / DeiT / DINOv2 (CLIP, SigLIP, DINOv3); the defaults are the
    # classic ViT, so bundles written before these fields existed load unchanged.
    act: str = "gelu"  # the MLP's activation: gelu | gelu_tanh (SigLIP) | quick_gelu (CLIP) | silu
    pre_norm: bool = False  # a LayerNorm on the embedded tokens, before the blocks (CLIP)
    patch_bias: bool = True  # the patch embedding's bias (CLIP has none)
    proj_dim: int = 0  # a bias-free projection of the pooled vector (CLIP image embedding); 0 none
    # The classifier reads the pooled vector scaled to unit length: a zero-shot head, the
    # label prompts' text embeddings times the logit scale (CLIP / SigLIP; export/zero_shot.py)
    head_norm: bool = False
    rope_theta: float = 100.0  # pos_embed 'rope': the base of the rotary frequencies (DINOv3)
    mlp: str = "plain"  # plain | gated (MLPS; DINOv3 H+ / 7B): export/mlp.py
    name: str = field(default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "img_size", _pair(self.img_size, "img_size"))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        object.__setattr__(self, "merge", tuple(self.merge))
        for name in ("patch_size", "heads"):  # the checks below divide by them
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        checks = [
            (self.pos_embed in POS_EMBED_KINDS,
             f"pos_embed must be one of {POS_EMBED_KINDS}, got {self.pos_embed!r}"),
            (self.pool in POOLS, f"pool must be one of {POOLS}, got {self.pool!r}"),
            (self.act in ACTIVATIONS, f"act must be one of {ACTIVATIONS}, got {self.act!r}"),
            (self.mlp in MLPS, f"mlp must be one of {MLPS}, got {self.mlp!r}"),
            (self.proj_dim >= 0 and not (self.proj_dim and self.num_classes
                                         and not self.head_norm),
             f"proj_dim must be >= 0 and a projection has no classifier after it but a "
             f"zero-shot head (head_norm), got proj_dim {self.proj_dim} with num_classes "
             f"{self.num_classes}"),
            (not self.head_norm or (self.num_classes and not self.dist_token),
             "head_norm (a zero-shot head) needs num_classes >= 1 and no distillation token"),
            (self.pos_embed != "rope" or self.head_dim % 4 == 0,
             f"pos_embed 'rope' needs a head dim divisible by 4 (a quarter per axis for sin "
             f"and cos), got {self.head_dim}"),
            (self.rope_theta > 0, f"rope_theta must be > 0, got {self.rope_theta}"),
            (not (self.merge and (self.pos_embed == "rope" or self.pool == "map")),
             "token merging is not supported with pos_embed 'rope' or pool 'map'"),
            (self.pos_interp in INTERP_MODES,
             f"pos_interp must be one of {INTERP_MODES}, got {self.pos_interp!r}"),
            (self.pool != "cls" or self.class_token,
             "pool='cls' needs class_token=True"),
            (self.patch_size >= 1, f"patch_size must be >= 1, got {self.patch_size}"),
            (min(self.width, self.depth, self.heads, self.in_chans) >= 1 and self.num_classes >= 0,
             "width, depth, heads and in_chans must be >= 1, num_classes >= 0 (0: no head)"),
            (self.num_registers >= 0, f"num_registers must be >= 0, got {self.num_registers}"),
            (not self.dist_token or self.pool == "cls", "dist_token needs pool='cls'"),
            (self.pos_prefix_tokens is None
             or 0 <= self.pos_prefix_tokens <= self.num_prefix_tokens,
             f"pos_prefix_tokens must be between 0 and {self.num_prefix_tokens}"),
            (self.width % self.heads == 0,
             f"width {self.width} is not divisible by heads {self.heads}"),
            (all(s % self.patch_size == 0 and s > 0 for s in self.img_size),
             f"img_size {self.img_size} must be positive multiples of patch_size "
             f"{self.patch_size}"),
            (len(self.merge) in (0, self.depth) and all(
                isinstance(r, int) and r >= 0 for r in self.merge),
             f"merge must be empty or {self.depth} numbers >= 0 (one per block), "
             f"got {list(self.merge)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        check_normalization(self.mean, self.std, channels=self.in_chans)

    @property
    def grid_size(self) -> tuple[int, int]:
        """Native patch grid (gh, gw)."""
        return (self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size)

    @property
    def num_prefix_tokens(self) -> int:
        """cls + dist + registers, in that order before the patch tokens."""
        return int(self.class_token) + int(self.dist_token) + self.num_registers

    @property
    def num_pos_prefix(self) -> int:
        """How many of the prefix tokens have a row in the position table."""
        if self.pos_prefix_tokens is not None:
            return self.pos_prefix_tokens
        return int(self.class_token) + int(self.dist_token)

    @property
    def merging(self) -> bool:
        return any(self.merge)

    def merge_schedule(self, patches: int) -> tuple[int, ...]:
        """Tokens each block merges for an input of `patches` patches: merge[l], or fewer
        where the block has fewer than 2 merge[l] + prefix tokens (ToMe's clamp,
        min(r, (T - prefix) // 2): small inputs merge less, and every size runs)."""
        tokens, out = self.num_prefix_tokens + patches, []
        for r in self.merge:
            r = min(r, (tokens - self.num_prefix_tokens) // 2)
            out.append(r)
            tokens -= r
        return tuple(out)

    @property
    def pooled_dim(self) -> int:
        """The width of the pooled vector (`pooled`): the projection's, else the model's."""
        return self.proj_dim or self.width

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def replace(self, **changes: Any) -> ViTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("img_size", "mean", "std", "merge"):
            d[key] = list(d[key])
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ViTConfig keys {unknown}; known keys: {sorted(known)}")
        d = dict(d)
        for f in dataclasses.fields(cls):
            if f.name in d:
                d[f.name] = _typed(f.name, d[f.name], cls.__dataclass_fields__[f.name].default)
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> ViTConfig:
        return cls.from_dict(json.loads(text))


def _typed(name: str, value: Any, default: Any) -> Any:
    """`value` if it has the type of the field's default (JSON lists become tuples), else a
    ValueError naming the field: a config read from a file is checked, not trusted."""
    def fail(expected: str) -> ValueError:
        return ValueError(f"{name} must be {expected}, got {repr(value)[:40]}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**31

    def is_float(v: Any) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v) and abs(v) < 1e12)

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise fail("true or false")
    elif isinstance(default, int) or name in ("pos_prefix_tokens", "trained_patch_size"):
        if not (is_int(value) or (value is None and default is None)):
            raise fail("an integer" + (" or null" if default is None else ""))
    elif isinstance(default, float):
        if not is_float(value):
            raise fail("a finite number")
        value = float(value)
    elif isinstance(default, str):
        if not isinstance(value, str) or len(value) > 200:
            raise fail("a string")
    elif isinstance(default, tuple):
        ints = name in ("img_size", "merge")
        check = is_int if ints else is_float
        if not isinstance(value, (list, tuple)) or not all(check(v) for v in value):
            raise fail("a list of " + ("integers" if ints else "finite numbers"))
        value = tuple(value)
    return value


def _pair(value: Any, what: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    try:
        h, w = value
        return (int(h), int(w))
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an int or a pair of ints, got {value!r}") from None


def parse_variant(name: str) -> tuple[str, int | None]:
    """'B/16' -> ('B', 16); 'B' -> ('B', None)."""
    size, _, patch = name.partition("/")
    if size not in VARIANTS:
        raise ValueError(f"unknown model variant {name!r}; known: {', '.join(VARIANTS)} "
                         f"(optionally with /PATCH, e.g. B/16)")
    if not patch:
        return size, None
    if not patch.isdigit() or int(patch) < 1:
        raise ValueError(f"patch size in {name!r} must be a positive integer")
    return size, int(patch)


def variant(name: str, /, **overrides: Any) -> ViTConfig:
    """Config of a named variant: variant('B/16'), variant('tiny', patch_size=8).

    Ti/S/B/L use patch 16 and 224×224 unless given; `tiny` uses patch 8 on 32×32.
    """
    size, patch = parse_variant(name)
    base: dict[str, Any] = dict(VARIANTS[size])
    if size == "tiny":
        base.update(img_size=(32, 32), patch_size=8, num_classes=10)
    if patch is not None:
        base["patch_size"] = patch
    if "patch_size" in overrides and overrides["patch_size"] is None:
        overrides.pop("patch_size")
    base.update({k: v for k, v in overrides.items()})
    p = base.get("patch_size", 16)
    base.setdefault("name", f"{size}/{p}")
    return ViTConfig(**base)


def config_from_flags(model: str, *, patch: int | None = None,
                      native_res: tuple[int, int] | None = None, num_classes: int | None = None,
                      pos_embed: str = "learned", pool: str = "cls") -> ViTConfig:
    """The config the export command's flags describe. Flags that contradict each other
    (`--model B/16 --patch 8`) are an error, never a silent choice."""
    size, named_patch = parse_variant(model)
    if patch is not None and named_patch is not None and patch != named_patch:
        raise ValueError(f"--model {model} says patch {named_patch} and --patch says {patch}; "
                         f"give one of them")
    overrides: dict[str, Any] = dict(pos_embed=pos_embed, pool=pool, class_token=True)
    if patch is not None or named_patch is not None:
        overrides["patch_size"] = patch or named_patch
    if native_res is not None:
        overrides["img_size"] = native_res
    if num_classes is not None:
        overrides["num_classes"] = num_classes
    return variant(size, **overrides)


def parse_merge(text: str | None, depth: int) -> tuple[int, ...]:
    """--merge-tokens: 'R' merges R tokens in every block; 'r1,r2,...' one number per block
    (depth of them); '' or '0': none."""
    if not text:
        return ()
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts) or len(parts) not in (1, depth):
        raise ValueError(f"--merge-tokens must be one number of tokens merged per block, or "
                         f"{depth} comma-separated numbers (one per block), got {text!r}")
    merge = tuple(int(p) for p in parts) * (depth if len(parts) == 1 else 1)
    return merge if any(merge) else ()
