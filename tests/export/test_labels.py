"""Class names for a checkpoint's head: its own when it carries them, ImageNet-1k's
(shipped with the package) for a 1000-class head that carries none, else none."""

from pathlib import Path

from vit_deploy.data import IMAGENET_CLASSES, imagenet_labels
from vit_deploy.export.sources import CheckpointSource


def test_the_shipped_imagenet_names():
    names, origin = imagenet_labels()
    assert len(names) == IMAGENET_CLASSES == 1000
    assert all(isinstance(n, str) and n.strip() == n and n for n in names)
    # spot checks against the standard ILSVRC-2012 index order
    assert (names[0], names[1], names[207], names[281], names[999]) == (
        "tench", "goldfish", "Golden Retriever", "tabby cat", "toilet paper")
    assert "imagenet-classes" in origin and "MIT" in origin


def test_a_1000_class_head_without_names_gets_imagenets():
    source = CheckpointSource(path=Path("w.safetensors"), source="timm")
    assert source.labels_for(1000) == imagenet_labels()[0]
    assert source.manifest_record(1000)["labels_from"].startswith("ImageNet-1k names shipped")
    assert source.labels_for(10) is None and "labels_from" not in source.manifest_record(10)


def test_a_checkpoints_own_names_win_and_a_wrong_count_is_not_used():
    own = tuple(f"class {i}" for i in range(1000))
    source = CheckpointSource(path=Path("d"), source="hf", labels=own,
                              labels_from="d/config.json (id2label)")
    assert source.labels_for(1000) == own
    assert source.manifest_record(1000)["labels_from"] == "d/config.json (id2label)"
    short = CheckpointSource(path=Path("d"), source="hf", labels=own[:5], labels_from="x")
    assert short.labels_for(1000) is None  # its own (wrong) count: not replaced by ImageNet's
    assert "5 class names in x for a head of 1000 classes: not used" in \
        short.manifest_record(1000)["notes"]
