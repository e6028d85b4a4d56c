"""A Hugging Face hub cache in a folder of the test's own, in the layout huggingface_hub
reads (models--ORG--NAME/{blobs, snapshots/<commit>/, refs/}: the folder name from the
library's own repo_folder_name), so that checkpoints named on the hub resolve offline."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from huggingface_hub.file_download import repo_folder_name

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def write_repo(cache: Path, repo_id: str, files: dict[str, bytes], *, commit: str,
               refs: tuple[str, ...] = ("main",)) -> Path:
    """One commit of a model repository in the hub cache: each file a blob named by its git
    hash, a snapshots/<commit>/ entry linking to it, and refs/<name> holding the commit."""
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = repo / "snapshots" / commit
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
