"""`vit-deploy serve`: a small HTTP server for one machine, with request batching. Needs
the `serve` extra (FastAPI, uvicorn, python-multipart, prometheus-client); nothing here is
imported by `vit_deploy.serve` itself, so `import vit_deploy.serve.limits` costs only what
that module needs.

Two APIs over one request batcher, one APIRouter each, included by `app.make_app`:

- `predict`: `POST /predict` (raw image bytes or multipart) -> top-k JSON; `GET /health`,
  `/metadata` (the manifest), `/stats` (counters and latency percentiles as JSON),
  `/metrics` (Prometheus text: requests by endpoint and status, a latency histogram,
  batch sizes, queue depth);
- `v2`: the Open Inference Protocol (KServe v2 REST, what Triton and KServe speak), with
  the model name, tensor names, datatypes and shapes of `vit_deploy.triton.model_metadata`
  (the ones `vit-deploy triton` writes into config.pbtxt); `codec` reads and writes its
  bodies, `tensor_json` parses JSON tensor data straight into arrays.

The rest: `batcher` (the worker that batches requests and runs the session), `limits`
(what a request may cost, and reading bodies within it), `connections` (deadlines and a
connection cap below the app, the log-flood filter), `metrics`, `errors` (`Failure` and
the exception handlers that answer every route's errors as `{"error": "..."}`), `state`
(the dependencies through which routes get the app's shared state), `answer` (one
inference request's life, for both protocols) and `run` (`serve`: bind, then run uvicorn).

One bad request never harms the next: whatever fails in the batching worker is answered
to the request(s) it belongs to, the worker loop itself keeps going, and /health answers
503 if it stopped. Hostile clients meet `limits.Limits` (one frozen dataclass, carried by
the app to `serve`): deadlines for headers and bodies, a minimum rate for bodies, a bound
on open connections, sizes checked from what is declared before anything is read or
decoded, a budget of bodies parsed and bytes held at once (taken as bodies arrive, so slow
senders hold next to nothing and never keep fast ones out), non-finite numbers refused in
inputs and never sent as JSON, and a repeated log message logged once, then at most once
per `connections.LOG_REPEAT_S`.
"""
