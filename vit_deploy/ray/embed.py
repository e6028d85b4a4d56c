"""`vit-deploy embed`: pooled features, logits and top-k classes of many images, one row
per image, to Parquet: in this process (the default, no Ray needed) or with Ray Data.

The job: the image paths (`shards.collect_paths`) are cut into deterministic shards; those
already written (a killed run's) are skipped. In this process one session embeds the
rest shard by shard (_run_here). On a cluster Ray Data reads them: tasks read each file
and preprocess it by the manifest's rule (the runtime's `Preprocess`), an actor pool of
ViTSessions (`map_batches` with a callable class) runs the model on same-size groups, and
the driver writes each shard atomically once all its rows are in, saying how far it got.
An image that cannot be read or decoded is a row with its `error` and no outputs, never
the end of the job. Last, the shards become the output file (atomically) and their folder
is removed.

Columns: path, error (null when the image was used), then per output the bundle has:
pooled (list<float32>), logits (list<float32>), top_k_index, top_k_probability
(best first) and top_k_label (bundles with labels)."""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from vit_deploy.progress import Progress, silent
from vit_deploy.ray import SHARD_SIZE
from vit_deploy.runtime.contract import FEATURES_NAME, LOGITS_NAME
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.preprocess import Preprocess, group_by_shape
from vit_deploy.runtime.results import probabilities
from vit_deploy.runtime.swap import writer_lock
from vit_deploy.ray.shards import Shard, collect_paths, job_key, merge, own_parts_dir, plan, \
    remove_partial, stamps, write_table_atomic


READ_CPUS = 0.5  # each image-reading task's CPUs


@dataclass(frozen=True, kw_only=True)
class EmbedOptions:
    """The session (provider, precision), top-k classes per image, images per model run
    (`batch`), images per shard (the unit written and resumed), the actor pool (`actors`
    sessions, None: half the cluster's CPUs over `cpus_per_actor`) and the Ray address."""

    provider: str = "cpu"
    precision: str = "fp32"
    top_k: int = 5
    batch: int = 32
    shard_size: int = SHARD_SIZE
    actors: int | None = None
    cpus_per_actor: float = 1.0
    address: str | None = None  # None: in this process, no Ray; else a Ray cluster's
    wait_s: float = 60.0  # for the actors' CPUs to come free (cluster.wait_for_cpus)

    def __post_init__(self) -> None:
        bad = [f"{k}={getattr(self, k)!r}" for k in ("top_k", "batch", "shard_size")
               if getattr(self, k) < 1]
        if self.actors is not None and self.actors < 1:
            bad.append(f"actors={self.actors!r}")
        if self.cpus_per_actor <= 0:
            bad.append(f"cpus_per_actor={self.cpus_per_actor!r}")
        if bad:
            raise ValueError(f"embed options out of range: {', '.join(bad)} (expected top_k, "
                             f"batch, shard_size, actors >= 1 and cpus_per_actor > 0)")


@dataclass
class EmbedReport:
    """What a job did: the file written, its rows, shards written now and found done, the
    images that could not be used (path -> why), seconds taken."""

    out: Path
    images: int
    shards_written: int
    shards_skipped: int
    bad: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def __str__(self) -> str:
        resumed = f", {self.shards_skipped} found done" if self.shards_skipped else ""
        bad = f"; {len(self.bad)} image(s) could not be used (column error)" if self.bad else ""
        return (f"wrote {self.out}: {self.images} image(s), {self.shards_written} shard(s) "
                f"computed{resumed}, in {self.seconds:.1f} s{bad}")


def _read_and_preprocess(batch: dict[str, np.ndarray], pre: Preprocess) -> dict[str, Any]:
    """Ray Data task: each path's file, preprocessed -> (C, H, W) float32 as bytes and its
    shape, or the reason it could not be ("" when none: a column of nulls would not stay
    strings between Ray Data's steps)."""
    pixels, shapes, errors = [], [], []
    for path in batch["path"]:
        try:
            with open(path, "rb") as f:
                x = pre(f.read())
            pixels.append(x.tobytes())
            shapes.append(list(x.shape))
            errors.append("")
        except Exception as e:  # unreadable, not an image, too large: this image's row says so
            pixels.append(b"")
            shapes.append([0, 0, 0])
            errors.append(" ".join(f"{type(e).__name__}: {e}".split())[:500])
    return {"path": batch["path"], "pixels": np.array(pixels, dtype=object),
            "shape": np.array(shapes, dtype=np.int64), "error": np.array(errors, dtype=object)}


class Embedder:
    """Ray Data actor: one ViTSession; a batch of preprocessed rows -> their output rows."""

    def __init__(self, bundle: str, provider: str, precision: str, top_k: int, batch: int,
                 threads: int | None):
        from vit_deploy.runtime import ViTSession
        from vit_deploy.runtime.embedding import purpose_of
        from vit_deploy.runtime.ort_session import RuntimeOptions

        self.session = ViTSession(bundle, provider=provider, precision=precision,
                                  options=RuntimeOptions(threads=threads))
        self.top_k, self.batch = top_k, batch
        self.rule = purpose_of(self.session).probabilities  # softmax, or SigLIP's sigmoid
        self.outputs = output_columns(self.session.output_names, self.session.labels)

    def __call__(self, rows: dict[str, np.ndarray]) -> pa.Table:
        n = len(rows["path"])
        errors = [str(e) or None for e in rows["error"]]
        got: dict[str, list[Any]] = {name: [None] * n for name in self.outputs}
        items = [(i, np.frombuffer(rows["pixels"][i], np.float32).reshape(rows["shape"][i]))
                 for i in range(n) if errors[i] is None]
        for indices, pixels in group_by_shape(items):
            for start in range(0, len(indices), self.batch):
                part = indices[start:start + self.batch]
                try:
                    outs = self.session.run_all(pixels[start:start + self.batch])
                except Exception as e:  # this group's images say why; the job goes on
                    for i in part:
                        errors[i] = " ".join(f"{type(e).__name__}: {e}".split())[:500]
                    continue
                self._fill(got, part, outs)
        columns = {"path": pa.array(list(rows["path"]), pa.string()),
                   "error": pa.array(errors, pa.string())}
        for name, kind in self.outputs.items():
            columns[name] = pa.array(got[name], kind)
        return pa.table(columns)

    def _fill(self, got: dict[str, list[Any]], part: list[int],
              outs: dict[str, np.ndarray]) -> None:
        if "pooled" in self.outputs:
            for i, row in zip(part, outs[FEATURES_NAME]):
                got["pooled"][i] = row
        if "logits" not in self.outputs:
            return
        logits = outs[LOGITS_NAME]
        probs = probabilities(logits, self.rule)
        k = min(self.top_k, probs.shape[1])
        for i, row, p in zip(part, logits, probs):
            top = np.argsort(-p, kind="stable")[:k]  # as ViTSession.classify orders them
            got["logits"][i] = row
            got["top_k_index"][i] = top.astype(np.int32)
            got["top_k_probability"][i] = p[top]
            if "top_k_label" in self.outputs:
                got["top_k_label"][i] = [self.session.labels[j] for j in top]


def output_columns(output_names: list[str], labels: Any) -> dict[str, pa.DataType]:
    """The output columns a session with these outputs (and labels or not) fills."""
    columns: dict[str, pa.DataType] = {}
    if FEATURES_NAME in output_names:
        columns["pooled"] = pa.list_(pa.float32())
    if LOGITS_NAME in output_names:
        columns.update(logits=pa.list_(pa.float32()), top_k_index=pa.list_(pa.int32()),
                       top_k_probability=pa.list_(pa.float64()))
        if labels:
            columns["top_k_label"] = pa.list_(pa.string())
    return columns


def embed(bundle: str | Path, images: list[str | Path], out: str | Path, *,
          options: EmbedOptions = EmbedOptions(), progress: Progress = silent) -> EmbedReport:
    """Run the job (module docstring) over `images` (folders, image files, .txt lists) and
    write `out` (Parquet) atomically. Shards a killed run wrote are reused; ValueError for
    a bad bundle, precision or image input before anything runs."""
    t0 = time.perf_counter()
    bundle, out = Path(bundle).resolve(), Path(out).resolve()
    with writer_lock(out):  # two jobs on one output: the second stops at once, naming the first
        return _embed(bundle, images, out, options, progress, t0)


def _embed(bundle: Path, images: list[str | Path], out: Path, options: EmbedOptions,
           progress: Progress, t0: float) -> EmbedReport:
    manifest = load_manifest(bundle)
    manifest.require_nchw("vit-deploy embed")
    pre = Preprocess.from_manifest(manifest)
    paths = collect_paths(images)
    if any(os.path.realpath(p) == os.path.realpath(out) for p in paths):
        raise ValueError(f"--out {str(out)!r} is one of the images to embed: it would be "
                         f"replaced; write the table elsewhere")
    model = manifest.model_file(options.precision)  # a precision it lacks: BundleError
    job = job_key(manifest.files[model].sha256,
                  options.precision, options.top_k, pre)
    shards = plan(paths, job=job, shard_size=options.shard_size, files=stamps(paths))
    folder = own_parts_dir(out)  # ours, or refused: never a user's folder or a symlink
    remove_partial(folder)
    pending = [s for s in shards if not (folder / s.name).exists()]
    progress(f"{len(paths)} image(s) in {len(shards)} shard(s); "
             f"{len(shards) - len(pending)} already written")
    if pending:
        try:
            run = _run if options.address is not None else _run_here
            run(bundle, pending, folder, pre, options, progress)
        except BaseException:
            if not any(folder.glob("part-*.parquet")):  # nothing to resume: no leftovers
                shutil.rmtree(folder, ignore_errors=True)
            raise
    table = merge([folder / s.name for s in shards], out)
    shutil.rmtree(folder, ignore_errors=True)
    errors = table.column("error").to_pylist()
    bad = {p: e for p, e in zip(table.column("path").to_pylist(), errors) if e is not None}
    return EmbedReport(out, table.num_rows, len(pending), len(shards) - len(pending), bad,
                       time.perf_counter() - t0)


def _run(bundle: Path, pending: list[Shard], folder: Path, pre: Preprocess,
         options: EmbedOptions, progress: Progress) -> None:
    import ray
    import ray.data

    from vit_deploy.ray.cluster import ClusterBusy, connected, wait_for_cpus

    with connected(options.address, quiet=progress is silent):  # -q: Ray's lines too
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # the progress line says it
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # shards complete one after another
        ctx.enable_progress_bars = False
        cpus = ray.cluster_resources().get("CPU", 1)
        if options.cpus_per_actor + READ_CPUS > cpus + 1e-9:
            raise ClusterBusy(f"embed: --cpus-per-actor {options.cpus_per_actor:g} and "
                              f"{READ_CPUS:g} CPU to read images need "
                              f"{options.cpus_per_actor + READ_CPUS:g}; the cluster has {cpus:g}")
        actors = options.actors or max(1, int(cpus / 2 / options.cpus_per_actor))
        # never a pool that waits for CPUs nobody frees: at least one actor's are free now
        # (or within the deadline), and a reading task's beside it (a killed run's worker
        # can hold the rest: then the pool took the last CPU and the readers never ran);
        # the pool grows to `actors` as more come free
        now = wait_for_cpus(options.cpus_per_actor, actors, what="embed's actors "
                            "(--cpus-per-actor)", reserve=READ_CPUS, deadline_s=options.wait_s,
                            progress=progress)
        progress(f"{now} of {actors} actor(s) can start now")
        paths = [p for s in pending for p in s.paths]
        blocks = max(1, min(len(paths), math.ceil(len(paths) / options.batch)))
        ds = ray.data.from_items([{"path": p} for p in paths], override_num_blocks=blocks)
        ds = ds.map_batches(_read_and_preprocess, fn_kwargs={"pre": pre}, batch_format="numpy",
                            batch_size=options.batch, num_cpus=READ_CPUS)
        ds = ds.map_batches(Embedder, batch_format="numpy", batch_size=options.batch,
                            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors),
                            num_cpus=options.cpus_per_actor,
                            fn_constructor_args=(str(bundle), options.provider,
                                                 options.precision, options.top_k,
                                                 options.batch,
                                                 max(1, int(options.cpus_per_actor))))
        _collect(ds, pending, folder, progress)


def _run_here(bundle: Path, pending: list[Shard], folder: Path, pre: Preprocess,
              options: EmbedOptions, progress: Progress) -> None:
    """The job in this process, without Ray: one session (every core), the shards in
    order, each written atomically once its rows are in (the same rows as on a cluster)."""
    embedder = Embedder(str(bundle), options.provider, options.precision, options.top_k,
                        options.batch, None)
    images = bad = 0
    for done, shard in enumerate(pending, 1):
        tables = []
        for start in range(0, len(shard.paths), options.batch):
            paths = np.array(shard.paths[start:start + options.batch], dtype=object)
            table = embedder(_read_and_preprocess({"path": paths}, pre))
            images += table.num_rows
            bad += table.num_rows - table.column("error").null_count
            tables.append(table)
        write_table_atomic(pa.concat_tables(tables), folder / shard.name)
        progress(f"embedding: {done}/{len(pending)} shard(s) written, {images} image(s), "
                 f"{bad} bad")


def _collect(ds: Any, pending: list[Shard], folder: Path, progress: Progress) -> None:
    """Rows as they come, each shard written once all its rows are in."""
    shard_of = {p: s for s in pending for p in s.paths}
    by_index = {s.index: s for s in pending}
    held: dict[int, list[pa.Table]] = {}
    count: dict[int, int] = {}
    done = images = bad = 0
    for table in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        images += table.num_rows
        bad += table.num_rows - table.column("error").null_count
        for index, rows in _split(table, shard_of).items():
            held.setdefault(index, []).append(rows)
            count[index] = count.get(index, 0) + rows.num_rows
            shard = by_index[index]
            if count[index] == len(shard.paths):
                part = pa.concat_tables(held.pop(index))
                order = {p: i for i, p in enumerate(shard.paths)}
                ranks = [order[p] for p in part.column("path").to_pylist()]
                write_table_atomic(part.take(np.argsort(ranks)), folder / shard.name)
                done += 1
                progress(f"embedding: {done}/{len(pending)} shard(s) written, {images} "
                         f"image(s), {bad} bad")
    if held:
        raise RuntimeError(f"the job ended with {len(held)} shard(s) incomplete: rows went "
                           f"missing (shard indices {sorted(held)[:5]})")


def _split(table: pa.Table, shard_of: dict[str, Shard]) -> dict[int, pa.Table]:
    """A batch's rows by the shard they belong to."""
    indices = np.array([shard_of[p].index for p in table.column("path").to_pylist()])
    return {int(i): table.filter(pa.array(indices == i)) for i in np.unique(indices)}
