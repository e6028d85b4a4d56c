"""The build hook: the wheel carries what `vit-deploy web` copies into a site.

Everything else about the package is in pyproject.toml. A wheel (`python -m build`, `pip
install .`) gets vit_deploy/web_assets/: our JavaScript from web/src and the pinned
onnxruntime-web files from web/node_modules (`npm ci` in web/, `make setup`), the list in
vit_deploy/website/files.py. An sdist carries the same files under web/, so a wheel built from it
gets them too. An editable install copies nothing: it reads the repository's web/.
"""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
WEB = HERE / "web"


def _web_files():
    spec = importlib.util.spec_from_file_location("_web_files", HERE / "vit_deploy" / "website" / "files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy_assets(dst: Path) -> None:
    for name in _web_files().asset_files(WEB):  # FileNotFoundError: npm ci has not run
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(WEB / name, dst / name)


class BuildPyWithWebAssets(build_py):
    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):
            _copy_assets(Path(self.build_lib) / "vit_deploy" / _web_files().PACKAGED_DIR)


class SdistWithWebAssets(sdist):
    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        _copy_assets(Path(base_dir) / "web")


setup(cmdclass={"build_py": BuildPyWithWebAssets, "sdist": SdistWithWebAssets})
