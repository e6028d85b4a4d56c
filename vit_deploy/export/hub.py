"""Checkpoints named on the Hugging Face hub: `hf:ORG/NAME[@REVISION]`, `timm:NAME[@REVISION]`.

Resolved through `huggingface_hub` (`hf_hub_download`): its cache (`HF_HUB_CACHE`,
`HF_HOME`), offline mode (`HF_HUB_OFFLINE=1`: the cache only), a token from the environment
(`HF_TOKEN`, or the one `hf auth login` stored) and revision pinning. timm's checkpoints live on
the hub as `timm/NAME`. The first file fixes the commit a revision (a branch, tag or hash)
points to; every other file is read at that commit, and the commit goes into the manifest.

The environment is read when a name is resolved, not when huggingface_hub is imported, so
a test (or a long-lived process) that sets HF_HUB_OFFLINE / HF_HUB_CACHE later is obeyed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_deploy.export.checkpoints import CheckpointError, not_a_file

HUB_KINDS = ("hf", "timm")
TIMM_ORG = "timm"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the first the repo has is used
_NAME = re.compile(r"^(hf|timm):([^@\s]+)(?:@([^@\s]+))?$")
_FORMS = "hf:ORG/NAME[@REVISION] or timm:NAME[@REVISION]"


class HubError(CheckpointError):
    """A hub name that does not resolve: says what was given and what was expected."""


@dataclass(frozen=True, kw_only=True)
class HubName:
    kind: str  # hf | timm
    repo_id: str  # ORG/NAME on the hub (timm:NAME is timm/NAME)
    revision: str | None  # as given; None: the default branch

    def __str__(self) -> str:
        name = self.repo_id.removeprefix(f"{TIMM_ORG}/") if self.kind == "timm" else self.repo_id
        return f"{self.kind}:{name}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True, kw_only=True)
class HubCheckpoint:
    """A hub name resolved to files in the local cache, at one commit."""

    name: HubName
    commit: str  # the 40-hex commit the revision resolved to
    snapshot: Path  # the cache's snapshots/<commit>/ directory
    files: dict[str, Path]  # file name -> local path (config.json, weights, processor config)
    notes: tuple[str, ...] = ()
    offline: bool = False

    @property
    def weights(self) -> Path:
        return next(self.files[n] for n in WEIGHT_FILES if n in self.files)

    @property
    def path(self) -> Path:
        """What the loaders read: the snapshot directory (hf), the weights file (timm)."""
        return self.snapshot if self.name.kind == "hf" else self.weights

    def record(self) -> dict[str, Any]:
        """The manifest's export record of where the weights came from."""
        return {"checkpoint": str(self.name), "repo_id": self.name.repo_id,
                "revision": self.name.revision or "main", "commit": self.commit,
                "files": sorted(self.files), "offline": self.offline,
                **({"notes": list(self.notes)} if self.notes else {})}


def parse_hub_name(text: str) -> HubName | None:
    """The hub name in `text`, None when it is not one (a path); HubError when it starts
    like one (hf: / timm:) but is malformed."""
    if not isinstance(text, str) or not text.startswith(tuple(f"{k}:" for k in HUB_KINDS)):
        return None
    m = _NAME.match(text)
    kind = text.split(":", 1)[0]
    if m is None:
        raise HubError(f"checkpoint {text!r} is not a hub name: expected {_FORMS}")
    _, name, revision = m.groups()
    if kind == "hf" and name.count("/") != 1:
        raise HubError(f"checkpoint {text!r}: expected hf:ORG/NAME[@REVISION] (one '/'), "
                       f"got {name!r}")
    if kind == "timm" and "/" in name:
        raise HubError(f"checkpoint {text!r}: expected timm:NAME[@REVISION], a timm model name "
                       f"without '/' (it is read from the hub as timm/NAME), got {name!r}")
    repo_id = name if kind == "hf" else f"{TIMM_ORG}/{name}"
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubError(f"checkpoint {text!r}: {repo_id!r} is not a valid hub repository id "
                       f"({str(e).splitlines()[0]})") from None
    return HubName(kind=kind, repo_id=repo_id, revision=revision)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_settings() -> tuple[bool, str]:
    """(offline, cache directory) as the environment says now, falling back to what
    huggingface_hub read when it was imported."""
    from huggingface_hub import constants

    offline = (_env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")
               or constants.HF_HUB_OFFLINE)
    cache = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME")
        else constants.HF_HUB_CACHE)
    return offline, os.path.expanduser(os.path.expandvars(cache))


@dataclass
class _Fetcher:
    name: HubName
    offline: bool
    cache: str
    commit: str | None = None
    notes: list[str] = field(default_factory=list)

    def where(self) -> str:
        rev = self.commit or self.name.revision or "main"
        return f"{self.name} ({self.name.repo_id} at {rev})"

    def get(self, filename: str, *, required: bool) -> Path | None:
        """The file at the pinned commit (the first call pins it); None when the repo has no
        such file and it is not `required`."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                            LocalEntryNotFoundError, RepositoryNotFoundError,
                                            RevisionNotFoundError)

        revision = self.commit or self.name.revision
        try:
            path = Path(hf_hub_download(self.name.repo_id, filename, revision=revision,
                                        cache_dir=self.cache, local_files_only=self.offline))
        except LocalEntryNotFoundError:
            if self.commit is not None and self._known_missing(filename):
                return None  # the cache recorded that the repo has no such file
            if self.commit is not None and not required:
                self.notes.append(f"{filename}: not in the cache at {self.commit[:12]} "
                                  f"(offline); its settings were not read")
                return None
            raise HubError(self._not_cached(filename)) from None
        except GatedRepoError:
            raise HubError(f"{self.where()}: the repository is gated; accept its terms on the "
                           f"hub and set HF_TOKEN") from None
        except RepositoryNotFoundError:
            raise HubError(f"{self.where()}: the hub has no repository {self.name.repo_id!r} "
                           f"(or it is private: set HF_TOKEN)") from None
        except RevisionNotFoundError:
            raise HubError(f"{self.where()}: {self.name.repo_id!r} has no revision "
                           f"{revision!r}; expected a branch, tag or commit hash") from None
        except EntryNotFoundError:
            if required:
                raise HubError(f"{self.where()}: the repository has no {filename}") from None
            return None
        except (HfHubHTTPError, OSError) as e:
            raise HubError(f"{self.where()}: {filename} could not be fetched "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                           f"with HF_HUB_OFFLINE=1 the cache ({self.cache}) is used alone"
                           ) from None
        why = not_a_file(path)  # a link to /dev/zero or a FIFO: refused, never opened
        if why is not None:
            raise HubError(f"{self.where()}: {filename} in the cache, {str(path)!r}, is {why}; "
                           f"expected a regular file (remove it from the cache and fetch it "
                           f"again)")
        if self.commit is None:
            self.commit = path.parent.name  # snapshots/<commit>/<file>
            if not re.fullmatch(r"[0-9a-f]{40}", self.commit):
                raise HubError(f"{self.where()}: {str(path)!r} is not in a snapshots/<commit>/ "
                               f"directory of the hub cache")
        return path

    def _known_missing(self, filename: str) -> bool:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.file_download import _CACHED_NO_EXIST

        got = try_to_load_from_cache(self.name.repo_id, filename, cache_dir=self.cache,
                                     revision=self.commit)
        return got is _CACHED_NO_EXIST

    def _not_cached(self, filename: str) -> str:
        """What the cache holds for the repo, against what was asked."""
        from huggingface_hub.file_download import repo_folder_name

        folder = Path(self.cache) / repo_folder_name(repo_id=self.name.repo_id, repo_type="model")
        refs = sorted(p.name for p in (folder / "refs").glob("*")) if folder.is_dir() else []
        snaps = sorted(p.name[:12] for p in (folder / "snapshots").glob("*")) \
            if folder.is_dir() else []
        asked = self.commit or self.name.revision or "main"
        if not folder.is_dir():
            held = f"the cache {self.cache} has no {self.name.repo_id!r}"
        elif self.commit is None and asked not in refs and not any(
                asked.startswith(s) for s in snaps):
            held = (f"the cache has no revision {asked!r} of it; it has refs {refs or 'none'} "
                    f"and snapshots {snaps or 'none'}")
        else:
            held = f"the cache has no {filename} at {asked[:12]}"
        how = ("downloads are off (HF_HUB_OFFLINE=1)" if self.offline
               else "it could not be downloaded")
        return (f"{self.where()}: {filename} is needed and {how}: {held}. Fetch it once online "
                f"(hf download {self.name.repo_id}"
                f"{f' --revision {self.name.revision}' if self.name.revision else ''})")


def resolve_hub(name: HubName | str) -> HubCheckpoint:
    """Fetch (or find in the cache) what a hub checkpoint needs: config.json, the weights
    (model.safetensors, else pytorch_model.bin) and, for hf:, preprocessor_config.json."""
    if isinstance(name, str):
        parsed = parse_hub_name(name)
        if parsed is None:
            raise HubError(f"checkpoint {name!r} is not a hub name: expected {_FORMS}")
        name = parsed
    offline, cache = hub_settings()
    fetch = _Fetcher(name, offline, cache)
    files = {"config.json": fetch.get("config.json", required=True)}
    for weights in WEIGHT_FILES:
        path = fetch.get(weights, required=False)
        if path is not None:
            files[weights] = path
            break
    else:
        raise HubError(f"{fetch.where()}: found neither of {list(WEIGHT_FILES)}"
                       + (" in the cache (offline)" if offline else "")
                       + " (sharded weights are not supported)")
    if name.kind == "hf":
        path = fetch.get("preprocessor_config.json", required=False)
        if path is not None:
            files["preprocessor_config.json"] = path
    return HubCheckpoint(name=name, commit=fetch.commit or "",  # set by the first file
                         snapshot=files["config.json"].parent,
                         files={k: v for k, v in files.items() if v is not None},
                         notes=tuple(fetch.notes), offline=offline)
