"""The export contract as data: names, dims, opset, tolerances (torch-free)."""

from __future__ import annotations

INPUT_NAME = "pixel_values"  # (batch, channels, height, width) float32, normalised
LOGITS_NAME = "logits"  # (batch, classes) float32
FEATURES_NAME = "pooled"  # (batch, width) float32, only when exported with features
BATCH_DIM, HEIGHT_DIM, WIDTH_DIM = "batch", "height", "width"
GRID_H_DIM, GRID_W_DIM = "grid_height", "grid_width"  # height / patch, width / patch

# Dense outputs (`export --outputs`). Patch tokens are laid out on the patch grid, ready
# for a convolutional head: (batch, width, grid_height, grid_width).
PATCH_TOKENS_NAME = "patch_tokens"  # the final-normed patch tokens, prefix tokens removed
CLASS_TOKEN_NAME = "class_token"  # (batch, width), final-normed
REGISTERS_NAME = "register_tokens"  # (batch, registers, width), final-normed
OUTPUT_KINDS = (LOGITS_NAME, FEATURES_NAME, PATCH_TOKENS_NAME, CLASS_TOKEN_NAME, REGISTERS_NAME)
LAYER_PREFIX = "layer_"  # layer_3: the patch tokens after block 3 (1-based), on the grid


def layer_output(block: int) -> str:
    """The output name of block `block`'s (1-based) patch tokens."""
    return f"{LAYER_PREFIX}{block}"

OPSET = 18  # Resize with antialias needs >= 18
IR_VERSION = 10  # onnx 1.23 writes 14 by default; onnxruntime 1.31 reads at most 13
PRODUCER = "vit-deploy"
METADATA_CONFIG_KEY = "vit_deploy.config"
METADATA_LINEARS_KEY = "vit_deploy.linear_nodes"  # {module path: ONNX node name}

MANIFEST_NAME = "manifest.json"
BUNDLE_FORMAT = "vit-deploy-bundle"
# v2: the typed manifest (every preprocessing field and file role spelled out); v1 is read.
BUNDLE_FORMAT_VERSION = 2
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "weights.safetensors"
WEIGHTS_ROLE = "weights"
LOCK_NAME = ".vit-deploy.lock"  # beside the bundle: two writers on one bundle take turns

# Preprocessing rules the runtime implements (runtime/preprocess.py): keep the aspect and
# centre-crop; keep the aspect, sides rounded to patch multiples; or squash (timm's name:
# each side scaled on its own, Hugging Face's size {height, width}), then maybe crop.
RESIZE_RULES = ("shorter_side_center_crop", "patch_multiple", "squash")
MIN_CROP_PCT = 0.1  # a crop_pct resizes to side / crop_pct first: at most 10x the crop
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "lanczos")

PRECISIONS = ("fp32", "fp16", "int8", "int8-static", "int4")  # int8 = dynamic
PRECISION_FILES = {"fp32": MODEL_FILE, "fp16": "model.fp16.onnx", "int8": "model.int8.onnx",
                   "int8-static": "model.int8-static.onnx", "int4": "model.int4.onnx"}

# Edge targets (`vit-deploy target`): fixed-shape graphs per resolution bucket, under
# targets/<name>/ in the bundle; the bucket policies the runtime implements (runtime/buckets.py).
TARGETS = ("cpu", "mobile", "npu", "web", "tensorrt")
TARGETS_DIR = "targets"
BUCKET_POLICIES = ("aspect-then-area",)



def model_role(precision: str) -> str:
    """A model file's role in the manifest."""
    return f"model:{precision}"


# Tolerance policy, PyTorch fp32 as the reference (docs/check-and-bench.md).
FP32_ABS_TOL = 1e-4  # scaled by max(1, max|ref|)
COSINE_MIN = {"fp32": 0.99999, "fp16": 0.999, "int8": 0.99, "int4": 0.95}


def tolerance_class(precision: str) -> str:
    """The policy a precision is judged by: int8-static as int8 (the one mapping)."""
    policy = precision.split("-")[0]
    if policy not in COSINE_MIN:
        raise ValueError(f"unknown precision {precision!r}; known: {list(PRECISIONS)}")
    return policy


# On the trained test model, quantised top-1 accuracy within this many points of fp32.
ACCURACY_MAX_DROP = {"int8": 1.0, "int4": 1.0}
# Batch independence: rows of untouched images may move only by float noise.
INDEPENDENCE_ABS_TOL = 1e-5

# More intra-op threads than this is a typo, not a machine (each thread is a stack and a
# spinning core: 10**6 of them run for minutes at gigabytes). The one bound: the CLI's
# --threads, RuntimeOptions and the JavaScript runtime's MAX_THREADS (web/src/lib/common.mjs,
# tests/test_hostile_table.py).
MAX_THREADS = 256
