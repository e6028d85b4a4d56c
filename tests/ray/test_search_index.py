"""`vit-deploy search` (ray/search.py): the rows of an `embed` Parquet file nearest to query
images, the same as the runtime's own vectors ranked by hand, and every file that is not
such an index refused in one line (exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.data import photo_paths
from vit_deploy.export.bundle import ExportOptions, export_bundle
from vit_deploy.ray.embed import embed
from vit_deploy.runtime import ViTSession


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, make_tiny):
    """A tiny backbone, a classifier without `pooled`, and the backbone's index of 8 photos."""
    root = tmp_path_factory.mktemp("search")
    model = make_tiny()
    export_bundle(model, root / "backbone", options=ExportOptions(
        resolution=(32, 32), outputs=("pooled", "patch_tokens"), simplify=False))
    export_bundle(model, root / "classifier", options=ExportOptions(
        resolution=(32, 32), simplify=False))
    photos = photo_paths("eval")[:8]
    embed(root / "backbone", photos, root / "photos.parquet")
    return root, photos


def _cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_search_ranks_as_the_runtime_vectors_do(indexed):
    root, photos = indexed
    r = _cli("search", root / "backbone", root / "photos.parquet", photos[2], photos[5],
             "--top-k", 3, "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    with ViTSession(root / "backbone") as s:
        index = s.embed(photos)
    for query, found in zip((2, 5), got["queries"]):
        scores = index @ index[query]  # cosine: unit vectors
        expected = [str(photos[i]) for i in np.argsort(-scores, kind="stable")[:3]]
        assert [m["path"] for m in found["matches"]] == expected
        assert found["matches"][0]["path"] == str(photos[query])  # the photo itself first
        np.testing.assert_allclose([m["similarity"] for m in found["matches"]],
                                   np.sort(scores)[::-1][:3], atol=1e-5)
    assert got["rows"] == 8 and got["similarity"] == "cosine" and got["column"] == "pooled"
    assert got["provider"] == "CPUExecutionProvider"
    quiet = _cli("search", root / "backbone", root / "photos.parquet", photos[2], "-q")
    assert quiet.exit_code == 0 and len(quiet.output.splitlines()) == 5
    assert quiet.output.splitlines()[0].split("\t")[:3] == [str(photos[2]), "1", str(photos[2])]


def test_what_is_not_an_index_of_this_bundle_is_refused_in_one_line(indexed, tmp_path):
    root, photos = indexed
    text = tmp_path / "notes.parquet"
    text.write_text("not parquet")
    other = tmp_path / "wide.parquet"  # vectors of another model: another width
    pq.write_table(pa.table({"path": ["a.jpg"], "error": pa.array([None], pa.string()),
                             "pooled": [[0.5] * 7]}), other)
    strings = tmp_path / "strings.parquet"
    pq.write_table(pa.table({"path": ["a.jpg"], "pooled": ["x"]}), strings)
    nan = tmp_path / "nan.parquet"
    pq.write_table(pa.table({"path": ["a.jpg"], "pooled": [[float("nan")] * 7]}), nan)
    cases = [(root / "backbone", text, "is not a Parquet file written by `vit-deploy embed`"),
             (root / "backbone", other, "holds 7-wide vectors"),
             (root / "backbone", strings, "not lists of floats"),
             (root / "backbone", nan, "NaN or Infinity"),
             (root / "classifier", root / "photos.parquet", "has no embedding output"),
             (root / "backbone", root / "missing.parquet", "does not exist")]
    nameless = tmp_path / "nameless.parquet"  # a row without a path is no match to show
    with ViTSession(root / "backbone") as s:
        v = s.embed(photos[:2])
    pq.write_table(pa.table({"path": pa.array([None, "b.jpg"], pa.string()),
                             "pooled": [v[0].tolist(), v[1].tolist()]}), nameless)
    r = _cli("search", root / "backbone", nameless, photos[0], "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["rows"] == 1 and got["skipped"] == 1
    assert [m["path"] for m in got["queries"][0]["matches"]] == ["b.jpg"]
    for bundle, index, message in cases:
        r = _cli("search", bundle, index, photos[0])
        assert r.exit_code == 2, (index, r.output)
        assert message in r.output and "Traceback" not in r.output, r.output
