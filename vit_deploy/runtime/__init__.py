"""Torch-free runtime: what an app embeds to run a vit-deploy bundle."""

from vit_deploy.runtime.manifest import BundleError, load_manifest
from vit_deploy.runtime.providers import ProviderError, available, parse_providers
from vit_deploy.runtime.session import InputError, ViTSession

__all__ = ["BundleError", "InputError", "ProviderError", "ViTSession", "available",
           "load_manifest", "parse_providers"]
