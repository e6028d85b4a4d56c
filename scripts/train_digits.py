"""Train the tiny test ViT on scikit-learn's handwritten digits (no download).

    pip install -e '.[export,train]' && python scripts/train_digits.py

Writes vit_deploy/data/digits.npz (the digits and the fixed split) and
vit_deploy/data/digits_vit.safetensors (weights + config), and prints the held-out
accuracy. Deterministic: fixed seeds, one thread. The sweep's 64-token models:

    python scripts/train_digits.py --size 64 --epochs 60 --out vit_deploy/data/digits64_vit.safetensors
    python scripts/train_digits.py --size 64 --epochs 60 --flexible 8,16,32 \
        --out vit_deploy/data/digits64_flexi_vit.safetensors
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vit_deploy.export.checkpoints import save_weights
from vit_deploy.runtime.config import variant
from vit_deploy.data import (DIGITS64_SIZE, DIGITS_FILE, DIGITS_MEAN, DIGITS_MODEL_FILE,
                             DIGITS_RECORD_FILE, DIGITS_SIZE, DIGITS_STD, data_path,
                             load_digits_split, normalise)
from vit_deploy.export.model import build_model

SEED = 0
TEST_FRACTION = 0.2


def write_dataset() -> None:
    """The digits and their fixed split (once: the file is committed)."""
    if data_path(DIGITS_FILE).exists():
        return
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(SEED)
    n = len(digits.target)
    is_test = np.zeros(n, dtype=bool)
    is_test[rng.permutation(n)[: int(round(n * TEST_FRACTION))]] = True
    np.savez_compressed(data_path(DIGITS_FILE), images=digits.images.astype(np.uint8),
                        labels=digits.target.astype(np.uint8), is_test=is_test)


def augment(x: torch.Tensor, gen: torch.Generator, shift: int) -> torch.Tensor:
    """Random shifts of up to `shift` pixels (the digits are not centred perfectly either)."""
    if shift == 0:
        return x
    S = x.shape[-1]
    pad = F.pad(x, (shift,) * 4, value=float(x.min()))
    out = torch.empty_like(x)
    offsets = torch.randint(0, 2 * shift + 1, (len(x), 2), generator=gen)
    for i, (dy, dx) in enumerate(offsets.tolist()):
        out[i] = pad[i, :, dy:dy + S, dx:dx + S]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--patch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--pool", default="mean", choices=["cls", "mean"])
    parser.add_argument("--wd", type=float, default=0.05)
    parser.add_argument("--shift", type=int, default=2, help="max random shift in pixels")
    parser.add_argument("--out", default=None, help="weights path (default: the package data)")
    parser.add_argument("--size", type=int, default=DIGITS_SIZE,
                        help=f"image side the 8x8 digits are upscaled to ({DIGITS_SIZE}; "
                             f"{DIGITS64_SIZE} for the sweep's 64-token model)")
    parser.add_argument("--flexible", default=None, metavar="P1,P2,...",
                        help="FlexiViT: a random patch size from this list per batch, the "
                             "kernel PI-resized from --patch (e.g. 8,16,32)")
    args = parser.parse_args()
    flexible = [int(p) for p in args.flexible.split(",")] if args.flexible else None
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    write_dataset()
    split = load_digits_split(args.size)
    x_train = torch.from_numpy(normalise(split["train_images"]))
    y_train = torch.from_numpy(split["train_labels"])
    x_test = torch.from_numpy(normalise(split["test_images"]))
    y_test = split["test_labels"]

    name = "digits-vit" if args.size == DIGITS_SIZE else f"digits{args.size}-vit"
    cfg = variant("tiny", width=64, depth=4, heads=4, patch_size=args.patch,
                  img_size=(args.size, args.size), num_classes=10, pool=args.pool,
                  mean=DIGITS_MEAN, std=DIGITS_STD, name=name + ("-flexi" if flexible else ""))
    model = build_model(cfg, seed=SEED).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd)
    steps = args.epochs * ((len(x_train) + 63) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps,
                                                pct_start=0.1)
    gen = torch.Generator().manual_seed(SEED)
    start = time.time()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=gen)
        for i in range(0, len(order), 64):
            idx = order[i:i + 64]
            patch = (flexible[int(torch.randint(len(flexible), (1,), generator=gen))]
                     if flexible else None)
            loss = F.cross_entropy(model(augment(x_train[idx], gen, args.shift), patch=patch),
                                   y_train[idx], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if epoch % 10 == 9 or epoch == args.epochs - 1:
            model.eval()
            with torch.no_grad():
                acc = {p: float((model(x_test, patch=p).argmax(1).numpy() == y_test).mean())
                       for p in flexible or [args.patch]}
            model.train()
            print(f"epoch {epoch + 1}: loss {loss.item():.3f}, held-out accuracy {acc}")
    model.eval()
    with torch.no_grad():
        per_patch = {p: round(float((model(x_test, patch=p).argmax(1).numpy() == y_test).mean()), 4)
                     for p in sorted(set((flexible or []) + [args.patch]))}
    acc = per_patch[args.patch]
    save_weights(model, args.out or data_path(DIGITS_MODEL_FILE))
    record = {"held_out_accuracy": round(acc, 4), "held_out_images": len(y_test),
                      "train_images": len(y_train), "epochs": args.epochs, "seed": SEED,
                      "patch": args.patch, "lr": args.lr, "pool": args.pool, "shift": args.shift,
                      "seconds": round(time.time() - start, 1), "torch": torch.__version__,
                      "size": args.size, "flexible": flexible,
                      "held_out_accuracy_per_patch": per_patch}
    print(json.dumps(record))
    where = data_path(DIGITS_RECORD_FILE) if args.out is None else Path(args.out).with_suffix(".json")
    where.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
