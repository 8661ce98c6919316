"""LoRA adapters beside the base model (PROTOCOL.md 1.3, "Adapters"): which adapters a
deployment offers (`--adapter NAME=DIR`, and the task adapters a folder ships as PEFT
subfolders, as jina-embeddings-v3's `retrieval.query`, ...), loaded with PEFT, and the scope
one batch is computed in.

PEFT does the work: `PeftModel.from_pretrained` / `load_adapter` inject the LoRA layers into
the loaded transformers module in place, `set_adapter` picks the one a batch uses and
`disable_adapter` gives the base model back. Every batch runs inside `scope(name)`, so the
batch planner, which never mixes adapters in a batch (its group key holds the adapter), is
the only thing that decides which adapter a forward pass uses."""

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"


class AdapterError(ValueError):
    """An adapter cannot be served as configured; one line naming it and what to do."""


def parse_adapter(spec: str) -> tuple[str, Path]:
    """`NAME=DIR` (the option's form) -> (NAME, DIR)."""
    name, sep, folder = spec.partition("=")
    name = name.strip()
    if not sep or not name or not folder.strip():
        raise AdapterError(f"--adapter {spec!r}: give NAME=DIR, e.g. "
                           f"--adapter legal=/models/lora-legal")
    return name, Path(folder.strip())


def folder_adapters(folder: Path) -> dict[str, Path]:
    """The task adapters a model folder ships: each subfolder holding a PEFT
    `adapter_config.json`, offered by the subfolder's name (jina-embeddings-v3's layout)."""
    return {sub.name: sub for sub in sorted(Path(folder).iterdir())
            if sub.is_dir() and (sub / ADAPTER_CONFIG).is_file()}


def adapters_of(folder: Path, given: dict[str, Path] | None) -> dict[str, Path]:
    """The adapters a deployment offers: the folder's own, then the ones given by name. A name
    given twice is refused rather than one of them silently winning."""
    found = folder_adapters(folder)
    for name, path in (given or {}).items():
        if name in found:
            raise AdapterError(f"--adapter {name}={path}: {folder} already ships an adapter "
                               f"named {name!r} ({found[name]}); give yours another name")
        if not (Path(path) / ADAPTER_CONFIG).is_file():
            raise AdapterError(f"--adapter {name}={path}: no {ADAPTER_CONFIG} there; give the "
                               f"folder PEFT's save_pretrained wrote")
        found[name] = Path(path)
    return found


def peft_missing() -> str | None:
    try:
        import peft  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


@dataclass
class Adapters:
    """The adapters attached to one loaded module, by the names requests use."""

    paths: dict[str, Path]
    peft_model: object = field(repr=False)
    # PEFT keeps adapters in torch ModuleDicts, whose keys cannot hold a dot; task names such as
    # `retrieval.query` do, so each adapter gets an internal name.
    internal: dict[str, str] = field(default_factory=dict)
    _active: str | None = field(default=None, repr=False)

    @property
    def names(self) -> list[str]:
        return list(self.paths)

    @contextlib.contextmanager
    def scope(self, name: str | None) -> Iterator[None]:
        """The module computes with adapter `name` (None: the base model) inside this block."""
        if name is None:
            with self.peft_model.disable_adapter():
                yield
            return
        target = self.internal[name]
        if self._active != target:
            self.peft_model.set_adapter(target)
            self._active = target
        yield


def attach_adapters(module, paths: dict[str, Path]) -> Adapters:
    """Load every adapter into `module` (in place) with PEFT; raises AdapterError in one line
    when PEFT is missing or an adapter does not fit the base model."""
    missing = peft_missing()
    if missing is not None:
        raise AdapterError(f"adapters {', '.join(paths)} need PEFT, which is not installed "
                           f"({missing}): pip install 'poolwire[adapters]'")
    from peft import PeftModel

    internal = {name: f"poolwire_{i}" for i, name in enumerate(paths)}
    peft_model = None
    for name, path in paths.items():
        try:
            if peft_model is None:
                peft_model = PeftModel.from_pretrained(module, str(path),
                                                       adapter_name=internal[name],
                                                       is_trainable=False)
            else:
                peft_model.load_adapter(str(path), adapter_name=internal[name], is_trainable=False)
        except (ValueError, KeyError, RuntimeError, OSError) as exc:
            raise AdapterError(f"adapter {name!r} ({path}) does not load onto this model: "
                               f"{' '.join(str(exc).split())[:300]}") from None
    peft_model.eval()
    adapters = Adapters(dict(paths), peft_model, internal)
    adapters._active = internal[next(iter(paths))]  # from_pretrained made the first one active
    log.info("adapters: %s", ", ".join(f"{n} ({p})" for n, p in paths.items()))
    return adapters
