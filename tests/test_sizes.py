import pytest

from vit_deploy.runtime.config import ViTConfig
from vit_deploy.runtime.sizes import require_patch_multiple, nearest_valid_sizes, parse_resolution


@pytest.mark.parametrize("text,hw", [("448", (448, 448)), ("320x480", (320, 480)),
                                     (" 32 X 64 ", (32, 64)), (224, (224, 224))])
def test_parse_resolution(text, hw):
    assert parse_resolution(text) == hw


@pytest.mark.parametrize("text", ["0", "-16", "abc", "16x", "x16", "16x16x3", "1.5", ""])
def test_parse_resolution_rejects(text):
    with pytest.raises(ValueError, match="resolution must be"):
        parse_resolution(text)


def test_nearest_valid_sizes():
    assert nearest_valid_sizes(230, 16) == (224, 240)
    assert nearest_valid_sizes(224, 16) == (224,)
    assert nearest_valid_sizes(5, 16) == (16,)


def test_check_input_size_message_names_size_patch_and_neighbours():
    with pytest.raises(ValueError, match=r"input width 230 .* patch size 16; nearest valid "
                                         r"sizes: 224 or 240"):
        require_patch_multiple(224, 230, 16)


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_a_memory_cgroup_limit_bounds_what_is_available(tmp_path, monkeypatch, version):
    """In a container (a 4 GB memory cgroup) the attention guard compared with the host's
    free memory, so one large request got the server OOM-killed; the cgroup's limit minus
    its usage (its own and every parent's: the tightest) now bounds it."""
    from vit_deploy.runtime import sizes

    root = tmp_path / "cgroup"
    inner = "/kubepods/pod1/c1"
    if version == "v2":
        (tmp_path / "proc").write_text(f"0::{inner}\n")
        files, base, unlimited = ("memory.max", "memory.current"), root, "max"
    else:
        (tmp_path / "proc").write_text(f"9:cpu:/\n4:memory:{inner}\n")
        files, base, unlimited = (("memory.limit_in_bytes", "memory.usage_in_bytes"),
                                  root / "memory", str(2**63 - 4096))
    limits = {"": unlimited, "kubepods": str(8 * 2**30), "kubepods/pod1": unlimited,
              "kubepods/pod1/c1": str(4 * 2**30)}
    used = {"": "0", "kubepods": str(7 * 2**30), "kubepods/pod1": str(2**30),
            "kubepods/pod1/c1": str(2**30)}
    for rel, limit in limits.items():
        (base / rel).mkdir(parents=True, exist_ok=True)
        (base / rel / files[0]).write_text(limit + "\n")
        (base / rel / files[1]).write_text(used[rel] + "\n")
    monkeypatch.setattr(sizes, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(sizes, "PROC_CGROUP", str(tmp_path / "proc"))
    # the container has 3 GiB left of its 4, but its parent only 1 of 8: the tightest wins
    assert sizes.cgroup_free() == 2**30
    monkeypatch.setattr(sizes, "_os_available", lambda: 20 * 2**30)
    assert sizes.available_memory() == 2**30
    cfg = ViTConfig(patch_size=8, width=48, depth=2, heads=3, img_size=(32, 32))
    with pytest.raises(sizes.MemoryEstimateError, match="memory cgroup"):
        sizes.guard_memory(1280, 1280, cfg)
    (tmp_path / "proc").write_text("0::/\n")  # no limit anywhere: the OS's figure
    for rel in limits:
        (base / rel / files[0]).write_text(unlimited + "\n")
    assert sizes.cgroup_free() is None and sizes.available_memory() == 20 * 2**30
