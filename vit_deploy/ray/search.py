"""The nearest rows of an `embed` Parquet file to query images (`vit-deploy search`): the
queries embedded with the bundle that wrote the file, compared with every row's vector by
the bundle's similarity (cosine: unit vectors, a dot product). Torch-free, Ray-free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError
from vit_deploy.runtime.manifest import dumps_strict
from vit_deploy.runtime.manifest_parts import BundleError

# one query's scores are N floats; the index itself is read once, N x D float32
MAX_K = 10_000


class IndexFileError(VitDeployError, ValueError):
    """An index file that is not what `vit-deploy embed` writes (exit 2: input we refuse)."""

    exit_code = BAD_INPUT


@dataclass(frozen=True)
class Index:
    path: Path
    column: str
    paths: list[str]
    vectors: np.ndarray  # (N, D) float32, unit length under cosine
    skipped: int  # rows without a vector (an image embed could not read) or a path


def read_index(path: Path, column: str, *, cosine: bool) -> Index:
    """The rows of `path` that have a vector in `column`, as one (N, D) array."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise IndexFileError(f"{str(path)!r} is not a Parquet file written by `vit-deploy "
                             f"embed` ({' '.join(str(e).split())[:200]})") from None
    if "path" not in schema.names or column not in schema.names:
        lacks = "path" if "path" not in schema.names else column
        raise IndexFileError(f"{str(path)!r} has no {lacks!r} column (columns: "
                             f"{schema.names}); search reads the {column!r} vectors that "
                             f"`vit-deploy embed` writes for this bundle")
    kind = schema.field(column).type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) \
            or not pa.types.is_floating(kind.value_type):
        raise IndexFileError(f"{str(path)!r}: column {column!r} holds {kind}, not lists of "
                             f"floats")
    table = pq.read_table(path, columns=["path", column])
    # a row is a match only with both its vector and its path (a null path names nothing)
    table = table.filter(pa.compute.and_(table.column(column).is_valid(),
                                         table.column("path").is_valid()))
    skipped = pq.read_metadata(path).num_rows - table.num_rows
    lengths = set(np.asarray(pa.compute.list_value_length(table.column(column))).tolist())
    if len(lengths) > 1:
        raise IndexFileError(f"{str(path)!r}: the {column!r} vectors have {len(lengths)} "
                             f"widths ({sorted(lengths)[:5]}): rows of different models mixed")
    width = lengths.pop() if lengths else 0
    flat = table.column(column).combine_chunks().flatten() if table.num_rows else []
    vectors = np.asarray(flat, np.float32).reshape(table.num_rows, width)
    if not np.isfinite(vectors).all():
        raise IndexFileError(f"{str(path)!r}: column {column!r} holds NaN or Infinity")
    if cosine:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return Index(path, column, [str(p) for p in table.column("path").to_pylist()], vectors,
                 skipped)


@dataclass(frozen=True)
class Found:
    query: str
    matches: list[tuple[str, float]]  # (path, similarity), best first


@dataclass
class SearchResult:
    bundle: str
    index: str
    column: str
    similarity: str
    rows: int
    skipped: int
    provider: str
    found: list[Found] = field(default_factory=list)

    def to_json(self) -> str:
        return dumps_strict({
            "bundle": self.bundle, "index": self.index, "column": self.column,
            "similarity": self.similarity, "rows": self.rows, "skipped": self.skipped,
            "provider": self.provider,
            "queries": [{"query": f.query, "matches": [{"path": p, "similarity": s}
                                                        for p, s in f.matches]}
                        for f in self.found]})

    def lines(self) -> list[str]:
        """query, rank, path, similarity (tab-separated), one line per match."""
        return [f"{f.query}\t{r}\t{p}\t{s:.6f}" for f in self.found
                for r, (p, s) in enumerate(f.matches, 1)]

    def __rich__(self) -> Any:
        from rich.text import Text

        return Text(str(self))  # paths as written: never read as markup

    def __str__(self) -> str:
        out = [f"{self.rows} row(s) of {self.index} ({self.column}, {self.similarity}"
               + (f"; {self.skipped} without a vector or a path" if self.skipped else "")
               + f"), queries embedded on {self.provider}"]
        for f in self.found:
            out.append(f"{f.query}:")
            out += [f"  {r}. {p}  {s:.4f}" for r, (p, s) in enumerate(f.matches, 1)]
        return "\n".join(out)


def search(bundle: Path, index_path: Path, queries: Sequence[Path], *, k: int = 5,
           precision: str = "fp32", provider: str = "cpu") -> SearchResult:
    """The `k` rows of `index_path` nearest each query image (embedded with `bundle`)."""
    from vit_deploy.runtime import ViTSession

    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be 1 to {MAX_K}, got {k}")
    with ViTSession(bundle, provider=provider, precision=precision) as s:
        purpose = s.manifest.purpose if s.manifest else None
        if purpose is None or purpose.embedding is None:
            raise BundleError(f"{str(bundle)!r} has no embedding output to search with "
                              f"(outputs: {s.output_names})")
        cosine = purpose.similarity == "cosine"
        index = read_index(index_path, purpose.embedding, cosine=cosine)
        got = s.embed(list(queries), normalize=cosine)
        if index.vectors.shape[0] and got.shape[1] != index.vectors.shape[1]:
            raise IndexFileError(f"{str(index_path)!r} holds {index.vectors.shape[1]}-wide "
                                 f"vectors, {str(bundle)!r} embeds {got.shape[1]} wide: "
                                 f"the file was written with another model")
        result = SearchResult(str(bundle), str(index_path), index.column, purpose.similarity,
                              len(index.paths), index.skipped, s.providers[0])
    for query, vector in zip(queries, got):
        scores = index.vectors @ vector
        top = np.argsort(-scores, kind="stable")[:k]
        result.found.append(Found(str(query), [(index.paths[i], float(scores[i])) for i in top]))
    return result
