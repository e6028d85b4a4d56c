"""Classify (or, --embed, embed) images over the Open Inference Protocol (KServe v2), against `vit-deploy serve`
or against Triton / KServe serving the repository `vit-deploy triton` wrote: same code,
only the URL differs.

    vit-deploy serve vit-B16-448 --name vit_b16 --port 8000
    python examples/oip_client.py --url localhost:8000 --model vit_b16 --bundle vit-B16-448 vit_deploy/data/photos/eval-chelsea.jpg

    vit-deploy triton vit-B16-448 --out repo --name vit_b16     # then Triton on repo/
    python examples/oip_client.py --url triton-host:8000 --model vit_b16 --bundle vit-B16-448 vit_deploy/data/photos/eval-chelsea.jpg

The bundle is read only for its preprocessing and labels (the runtime's `Preprocess`, no
model runs here); the server runs the model. The tensor names come from the server's model
metadata. Needs vit-deploy (`pip install .` in a checkout) and `pip install 'tritonclient[http]'`.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tritonclient.http as oip
from tritonclient.utils import InferenceServerException

from vit_deploy.runtime import BundleError, ImageError
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.preprocess import Preprocess


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="+")
    parser.add_argument("--url", default="localhost:8000", help="host:port of the server")
    parser.add_argument("--model", required=True, help="model name on the server")
    parser.add_argument("--bundle", required=True, help="the bundle: preprocessing and labels")
    parser.add_argument("--output", default="logits", help="the output to classify by")
    parser.add_argument("--embed", action="store_true",
                        help="print each image's embedding (the pooled output, unit length) "
                             "instead of classes: a backbone (DINOv2, CLIP, SigLIP)")
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)
    if args.embed and args.output == "logits":
        args.output = "pooled"
    elif not args.embed and args.output != "logits":
        print(f"error: only 'logits' are classes; {args.output!r} is no classifier's output "
              f"(--embed prints vectors)", file=sys.stderr)
        return 2
    try:
        manifest = load_manifest(args.bundle, verify=False)  # no model is run here
        preprocess = Preprocess.from_manifest(manifest)
        client = oip.InferenceServerClient(args.url.removeprefix("http://"))
        if not client.is_model_ready(args.model):
            print(f"error: model {args.model!r} is not ready at {args.url}", file=sys.stderr)
            return 1
        pixels = client.get_model_metadata(args.model)["inputs"][0]["name"]
        for path in args.images:
            x = preprocess(path)[None]  # (1, C, H, W) float32, normalised
            request = oip.InferInput(pixels, list(x.shape), "FP32")
            request.set_data_from_numpy(x, binary_data=True)
            result = client.infer(args.model, [request],
                                  outputs=[oip.InferRequestedOutput(args.output)])
            if args.embed:
                v = result.as_numpy(args.output)[0].astype(np.float64)
                v = v / max(float(np.linalg.norm(v)), 1e-12)
                print(f"{path}: {args.output} dim {len(v)}, unit length: "
                      + " ".join(f"{x:.4f}" for x in v[:8]) + (" ..." if len(v) > 8 else ""))
                continue
            probs = softmax(result.as_numpy(args.output).astype(np.float64))[0]
            top = np.argsort(-probs, kind="stable")[:args.top_k]
            labels = manifest.labels
            print(f"{path}: " + ", ".join(f"{labels[i] if labels else i}: {probs[i]:.4f}"
                                          for i in top))
    except (BundleError, ImageError, FileNotFoundError, InferenceServerException,
            ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
