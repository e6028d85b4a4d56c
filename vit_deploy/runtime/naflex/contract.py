"""SigLIP 2 NaFlex: the graph's contract as data (names, dims, the metadata key, the patch
budget), imported by the manifest's validation and by preprocess.py alike; imports nothing,
so the manifest can know a NaFlex bundle without the preprocessing."""

PIXEL_VALUES = "pixel_values"  # (batch, num_patches, C*P*P) float32, normalised patches
ATTENTION_MASK = "pixel_attention_mask"  # (batch, num_patches) int32: 1 real, 0 padding
SPATIAL_SHAPES = "spatial_shapes"  # (batch, 2) int64: each image's (gh, gw)
NAFLEX_INPUTS = (PIXEL_VALUES, ATTENTION_MASK, SPATIAL_SHAPES)
NAFLEX_INPUT_DTYPES = ("float32", "int32", "int64")
POOLED = "pooled"  # (batch, width) float32: the attention-pooled embedding
LAST_HIDDEN = "last_hidden_state"  # (batch, num_patches, width): padding rows meaningless
NAFLEX_OUTPUTS = (POOLED, LAST_HIDDEN)
BATCH_DIM, PATCHES_DIM = "batch", "num_patches"
METADATA_NAFLEX_KEY = "vit_deploy.naflex"  # in the ONNX metadata: the inputs are NaFlex's
MAX_NUM_PATCHES = 256  # Siglip2ImageProcessor's default
PATCH_BUDGET_LIMIT = 65_536  # of max_num_patches: 200 MB of float32 per image at patch 16
NAFLEX_RESIZE = "naflex"  # the manifest's preprocess.resize of a NaFlex bundle
NAFLEX_LAYOUT = "patches"  # its preprocess.layout: (B, N, P*P*C), not NCHW
NAFLEX_PRECISIONS = ("fp16", "int8")  # what quantize adds to one (no NCHW calibration images)
# ViTSession's refusal of a NaFlex bundle or graph (formatted with path)
NAFLEX_NOT_VIT = ("{path!r} is a SigLIP 2 NaFlex model (patches + mask + grids, any aspect "
                  "ratio), which ViTSession does not run: open it with NaFlexSession, or "
                  "vit_deploy.runtime.open_session, which picks the session a bundle needs")
