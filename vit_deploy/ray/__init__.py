"""Ray: online serving with Ray Serve, offline embedding with Ray Data (the `ray` extra).

- `serve_app`: the Ray Serve application of a bundle (`app(bundle, RayServeOptions(...))`),
  replicas of the torch-free runtime behind the same HTTP surface as `vit-deploy serve`
  (its FastAPI app as the ingress, Ray Serve's @serve.batch as the batcher), and the
  `serve deploy` config file (`write_config`);
- `cluster`: joining a cluster (auto, local, an address) and `serve --ray`'s deploy-and-hold;
- `embed`: `vit-deploy embed`, a Ray Data job that writes pooled features, logits and top-k
  of many images to Parquet, resumably (shards);
- `shards`: the paths of such a job, its deterministic shards and their atomic files.

Nothing here is imported by the rest of vit_deploy, and this package imports nothing
until a module of it is imported, so `vit-deploy --help` loads no ray."""

# Images per shard of `embed` (the unit written atomically and skipped on a rerun): what a
# kill loses at most. Shards are cut from one Ray Data stream, so a small one costs a file,
# not a pipeline; 256 made 38 images one shard, lost whole to a kill 12 s in.
SHARD_SIZE = 32
