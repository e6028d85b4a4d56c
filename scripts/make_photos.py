"""Write the real photographs shipped as package data (vit_deploy/data/photos/).

    python scripts/make_photos.py SKIMAGE_WHEEL SKLEARN_WHEEL

Every photograph is public domain, CC0 or CC BY 2.0 (the licence of each is recorded in
photos/SOURCES.md, which this script writes): eight from scikit-image's wheel
(skimage/data), two from scikit-learn's wheel (sklearn/datasets/images), one from
matplotlib's sample data (the installed matplotlib). Each is resized so its longer side is
at most 448 pixels (Pillow, Lanczos) and saved as an 8-bit RGB JPEG, quality 90 (grey
photographs as RGB), so that the set stays under 1 MB. Deterministic for the same inputs.
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

from PIL import Image

OUT = Path(__file__).resolve().parents[1] / "vit_deploy" / "data" / "photos"
LONG_SIDE = 448

# name -> (source, member, role, what it shows, licence). role: "calib" photographs are what
# quantisation calibrates on by default, "eval" ones are held out: no photograph is in both.
PHOTOS = {
    "astronaut": ("skimage", "skimage/data/astronaut.png", "calib",
                  "Eileen Collins, NASA portrait", "public domain (NASA)"),
    "coffee": ("skimage", "skimage/data/coffee.png", "calib", "a cup of coffee",
               "CC0 (photographer Rachel Michetti)"),
    "rocket": ("skimage", "skimage/data/rocket.jpg", "calib", "Falcon 9 launch of DSCOVR",
               "public domain (SpaceX)"),
    "china": ("sklearn", "sklearn/datasets/images/china.jpg", "calib", "a temple in China",
              "CC BY 2.0, danielbuechele (Flickr), as shipped by scikit-learn"),
    "camera": ("skimage", "skimage/data/camera.png", "calib", "a man with a camera (grey)",
               "CC0 (photographer Lav Varshney)"),
    "ihc": ("skimage", "skimage/data/ihc.png", "calib", "immunohistochemistry micrograph",
            "no known copyright restrictions (CMMI)"),
    "chelsea": ("skimage", "skimage/data/chelsea.png", "eval", "Chelsea the cat",
                "CC0 (photographer Stefan van der Walt)"),
    "hopper": ("matplotlib", "grace_hopper.jpg", "eval", "Grace Hopper, U.S. Navy portrait",
               "public domain (U.S. federal government)"),
    "flower": ("sklearn", "sklearn/datasets/images/flower.jpg", "eval", "a flower",
               "CC BY 2.0, vultilion (Flickr), as shipped by scikit-learn"),
    "hubble": ("skimage", "skimage/data/hubble_deep_field.jpg", "eval", "Hubble deep field",
               "public domain (NASA)"),
    "retina": ("skimage", "skimage/data/retina.jpg", "eval", "fundus photograph of an eye",
               "CC0 (Wikimedia Commons, Mikael Häggström)"),
    "coins": ("skimage", "skimage/data/coins.png", "eval", "Greek coins from Pompeii (grey)",
              "no known copyright restrictions (Brooklyn Museum)"),
}


def read(source: str, member: str, wheels: dict[str, Path]) -> Image.Image:
    if source == "matplotlib":
        from matplotlib import cbook

        return Image.open(cbook.get_sample_data(member, asfileobj=False))
    with zipfile.ZipFile(wheels[source]) as z:
        return Image.open(io.BytesIO(z.read(member)))


def main(skimage_wheel: str, sklearn_wheel: str) -> None:
    wheels = {"skimage": Path(skimage_wheel), "sklearn": Path(sklearn_wheel)}
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (source, member, role, what, licence) in PHOTOS.items():
        image = read(source, member, wheels).convert("RGB")
        scale = LONG_SIDE / max(image.size)
        if scale < 1:
            image = image.resize((round(image.width * scale), round(image.height * scale)),
                                 Image.Resampling.LANCZOS)
        path = OUT / f"{role}-{name}.jpg"
        image.save(path, quality=90)
        rows.append(f"| `{path.name}` | {image.width}×{image.height} | {what} | {source}: "
                    f"`{member}` | {licence} |")
    (OUT / "SOURCES.md").write_text(
        "# Real photographs shipped with vit-deploy\n\n"
        "Written by `scripts/make_photos.py`. `calib-*` photographs are the default "
        "calibration set of `quantize`; `eval-*` ones are held out and judge every precision "
        "(`quantize`, `--max-drop`) by default. No photograph is in both sets.\n\n"
        "| file | size | what | taken from | licence |\n|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
