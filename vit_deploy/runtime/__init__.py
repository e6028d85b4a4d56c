"""Torch-free runtime: what an app embeds to run a vit-deploy bundle.

    from vit_deploy.runtime import ViTSession
    with ViTSession("bundle/", provider="cuda,cpu") as s:
        logits = s.run(pixel_values)
        top = s.predict(["cat.jpg"], top_k=5)

A SigLIP 2 NaFlex bundle (any aspect ratio) runs in NaFlexSession; open_session(bundle)
picks the session a bundle needs.
"""

from vit_deploy.runtime.manifest import Manifest, load_manifest
from vit_deploy.runtime.manifest_parts import BundleError
from vit_deploy.runtime.preprocess import ImageError, Preprocess, load_image
from vit_deploy.runtime.providers import ProviderError, available, parse_providers, probe
from vit_deploy.runtime.ort_session import RuntimeOptions
from vit_deploy.runtime.results import Classified, Prediction, softmax
from vit_deploy.runtime.naflex.session import NaFlexFeatures, NaFlexSession, open_session
from vit_deploy.runtime.session import InputError, ViTSession

__all__ = ["BundleError", "Classified", "ImageError", "InputError", "Manifest", "Prediction", "Preprocess",
           "ProviderError", "RuntimeOptions", "ViTSession", "available", "load_image",
           "load_manifest", "parse_providers", "probe", "softmax", "NaFlexFeatures",
           "NaFlexSession", "open_session"]
