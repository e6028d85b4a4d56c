"""Classify images with a vit-deploy bundle, using only the torch-free runtime.

    python examples/classify.py vit-B16-448 vit_deploy/data/photos/eval-chelsea.jpg vit_deploy/data/photos/eval-hopper.jpg --provider cuda,cpu --top-k 3

Copy this into your app: it needs `pip install .` in a checkout (or the wheel `make dist` writes) (no torch, no export extra).
"""

from __future__ import annotations

import argparse
import sys

from vit_deploy.runtime import BundleError, ImageError, ProviderError, ViTSession


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("images", nargs="+")
    parser.add_argument("--provider", default="cpu", help="e.g. cuda,cpu (preference order)")
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        with ViTSession(args.bundle, provider=args.provider) as session:
            print(f"running on {session.providers[0]}")
            for prediction in session.predict(args.images, top_k=args.top_k):
                best = ", ".join(f"{c.label or c.index}: {c.probability:.3f}" for c in prediction.top)
                print(f"{prediction.source}: {best}")
    except (BundleError, ImageError, ProviderError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
