"""Where a `--model` value points: a local folder, or a Hugging Face hub id resolved through
the local Hugging Face cache with huggingface_hub (which downloads into the cache only when
the machine is online and HF_HUB_OFFLINE is not set)."""

import os
from dataclasses import dataclass
from pathlib import Path

LOCAL_REVISION = "local"  # what discovery shows for a plain folder: no hub revision applies


@dataclass(frozen=True)
class ModelSource:
    path: Path          # the folder the model is read from
    revision: str       # the hub commit the cache resolved, or LOCAL_REVISION
    repo_id: str | None = None


def how_models_load(value: str) -> str:
    return (f"--model {value!r} is neither a local model folder nor a Hugging Face hub id in "
            f"the local cache ({_cache_dir() or 'the default HF cache'}); poolwire loads a local "
            f"folder (with config.json), or a hub id from the HF cache (HF_HUB_CACHE), "
            f"downloading it there only where HF_HUB_OFFLINE is off and the machine is online "
            f"(`poolwire serve` turns it on where it is unset: HF_HUB_OFFLINE=0 lets it download): "
            f"pass a folder, or fetch it first with `hf download {value}`")


def _cache_dir() -> str | None:
    # Read per call (not at import, as huggingface_hub's constants are) so the caller's
    # environment at start-up is the one that counts.
    return os.environ.get("HF_HUB_CACHE") or None


def _looks_like_repo_id(value: str) -> bool:
    parts = value.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not value.startswith((".", "~"))


def resolve_model_source(value: str | Path) -> ModelSource:
    """A folder that exists is used as it is; anything else is tried as a hub id."""
    text = str(value)
    folder = Path(text).expanduser()
    if folder.exists():
        # A Sentence-Transformers CLIP folder keeps config.json in its module's folder.
        if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
            raise ValueError(f"{folder.resolve()} is not a model folder: it has no config.json")
        return ModelSource(folder.resolve(), LOCAL_REVISION)
    if not _looks_like_repo_id(text):
        raise ValueError(f"{folder.resolve()} is not a model folder: it has no config.json "
                         f"(nothing exists there); pass a folder holding a transformers model, "
                         f"or a Hugging Face hub id (org/name) from the local cache")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        snapshot = snapshot_download(text, cache_dir=_cache_dir(), local_files_only=offline)
    except (LocalEntryNotFoundError, HFValidationError, OSError) as exc:
        raise ValueError(how_models_load(text)) from exc
    path = Path(snapshot)
    if not (path / "config.json").is_file():
        raise ValueError(f"hub id {text!r} resolved to {path}, which has no config.json: it is "
                         f"not a transformers model")
    # The cache's snapshot folder is named by the commit it holds.
    return ModelSource(path, path.name, text)
