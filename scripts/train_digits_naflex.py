"""Train the tiny SigLIP 2 NaFlex tower on scikit-learn's digits, each stretched to its own
aspect ratio (1:4 .. 4:1), so that a trained NaFlex model ships (no trained SigLIP 2 does
in any package the setup can install). No download.

    pip install -e '.[export,test]' && python scripts/train_digits_naflex.py

The tower is transformers' own Siglip2VisionModel (patch 4, a 8x8 position table, width 64,
4 layers, its MAP head), trained with a linear classifier on its pooled output; each batch
runs through the processor's NaFlex preprocessing (runtime/naflex/preprocess.py, pixel-exact to
Siglip2ImageProcessor) at a patch budget of 64. Writes vit_deploy/data/digits_siglip2/
(config.json + model.safetensors, save_pretrained: `export --checkpoint DIR --naflex`
reads it; classifier.safetensors: the head) and digits_siglip2.json (what was measured).
Deterministic: fixed seeds, one thread.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vit_deploy.data import (DIGITS_NAFLEX_BUDGET, DIGITS_NAFLEX_DIR, DIGITS_NAFLEX_PATCH,
                             DIGITS_NAFLEX_RECORD_FILE, data_path, digits_at_ratios,
                             load_digits_naflex)
from vit_deploy.runtime.naflex.preprocess import NaFlexPreprocess

SEED = 0


def tower(hidden: int = 64, layers: int = 4, heads: int = 4):
    import transformers as T

    cfg = T.Siglip2VisionConfig(hidden_size=hidden, intermediate_size=4 * hidden,
                                num_hidden_layers=layers, num_attention_heads=heads,
                                patch_size=DIGITS_NAFLEX_PATCH, num_patches=DIGITS_NAFLEX_BUDGET,
                                num_channels=3)
    return T.Siglip2VisionModel(cfg)


def batch_tensors(pre: NaFlexPreprocess, images: list[np.ndarray]) -> dict[str, torch.Tensor]:
    b = pre(images)
    return {"pixel_values": torch.from_numpy(b.pixel_values),
            "pixel_attention_mask": torch.from_numpy(b.pixel_attention_mask).long(),
            "spatial_shapes": torch.from_numpy(b.spatial_shapes)}


def accuracy(model, head, pre, images, labels) -> float:
    with torch.no_grad():
        logits = torch.cat([head(model(**batch_tensors(pre, images[i:i + 128])).pooler_output)
                            for i in range(0, len(images), 128)])
    return float((logits.argmax(1).numpy() == labels).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--wd", type=float, default=0.05)
    parser.add_argument("--out", default=None, help="directory (default: the package data)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    split = load_digits_naflex()
    rng = np.random.default_rng(SEED)
    pre = NaFlexPreprocess(patch_size=DIGITS_NAFLEX_PATCH, max_num_patches=DIGITS_NAFLEX_BUDGET)
    model = tower().train()
    head = torch.nn.Linear(model.config.hidden_size, 10)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.wd)
    n = len(split["train_digits"])
    steps = args.epochs * ((n + 63) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps,
                                                pct_start=0.1)
    start = time.time()
    for epoch in range(args.epochs):
        # each epoch: every digit at a fresh random aspect ratio (log-uniform, 1:4 .. 4:1)
        # and a random shift of up to one source pixel
        ratios = np.exp(rng.uniform(np.log(0.25), np.log(4.0), n))
        images = digits_at_ratios(split["train_digits"], ratios, shifts=rng.integers(-1, 2, (n, 2)))
        order = rng.permutation(n)
        for i in range(0, n, 64):
            idx = order[i:i + 64]
            out = model(**batch_tensors(pre, [images[j] for j in idx])).pooler_output
            loss = F.cross_entropy(head(out), torch.from_numpy(split["train_labels"][idx]),
                                   label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if epoch % 10 == 9 or epoch == args.epochs - 1:
            model.eval()
            acc = accuracy(model, head, pre, split["test_images"], split["test_labels"])
            model.train()
            print(f"epoch {epoch + 1}: loss {loss.item():.3f}, held-out accuracy {acc:.4f}",
                  flush=True)
    model.eval()
    acc = accuracy(model, head, pre, split["test_images"], split["test_labels"])
    out = Path(args.out) if args.out else data_path(DIGITS_NAFLEX_DIR)
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()},
              str(out / "classifier.safetensors"))
    record = {"held_out_accuracy": round(acc, 4), "held_out_images": len(split["test_labels"]),
              "held_out_ratios": "each digit at its own ratio, 1:4 .. 4:1 (digits_at_ratios)",
              "train_images": n, "epochs": args.epochs, "seed": SEED, "lr": args.lr,
              "patch": DIGITS_NAFLEX_PATCH, "max_num_patches": DIGITS_NAFLEX_BUDGET,
              "seconds": round(time.time() - start, 1), "torch": torch.__version__}
    print(json.dumps(record))
    where = (data_path(DIGITS_NAFLEX_RECORD_FILE) if args.out is None
             else out.with_suffix(".json"))
    where.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
