"""Whether a model folder asks to run its own Python (transformers' `auto_map`), decided from
its files before transformers is called.

transformers runs a folder's code only with `trust_remote_code=True`; left unset, it asks on
standard input ("Do you wish to run the custom code? [y/N]", waiting 15 s on a silent pipe), so
whatever feeds a worker's standard input would decide. poolwire reads the folder first: without
the operator's `--trust-remote-code` a folder that names code is refused in one line, and every
`from_pretrained` is given `trust_remote_code=` explicitly, so transformers never prompts."""

import json
from pathlib import Path

# The files whose `auto_map` transformers follows when poolwire loads a model: the config (the
# model classes) and the tokenizer's config (the tokenizer classes).
FILES_WITH_AUTO_MAP = ("config.json", "tokenizer_config.json")
TRUST_FLAG = ("--trust-remote-code (POOLWIRE_TRUST_REMOTE_CODE=1; offline "
              "PoolingModel(..., trust_remote_code=True))")


class RemoteCodeRefusedError(ValueError):
    """The folder names code to run and the operator did not allow it; str() is one line."""


def _code_files(reference) -> list[str]:
    """The Python files one `auto_map` value points at. A value is "module.Class", or
    "org/repo--module.Class" (code in another hub repository), or for a tokenizer a
    [slow, fast] pair, either of which may be null."""
    refs = reference if isinstance(reference, (list, tuple)) else [reference]
    out = []
    for ref in refs:
        if not isinstance(ref, str) or "." not in ref:
            continue
        repo, _, local = ref.rpartition("--")
        module = local.rsplit(".", 1)[0]
        out.append(f"{repo}:{module}.py" if repo else f"{module}.py")
    return out


def remote_code_files(folder: Path) -> dict[str, list[str]]:
    """{file with an auto_map: the Python files it would run}; empty for a folder that runs no
    code of its own. A file that is not a JSON object is left to transformers to refuse."""
    found: dict[str, list[str]] = {}
    for name in FILES_WITH_AUTO_MAP:
        path = Path(folder) / name
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if not auto_map:
            continue
        files = sorted({f for ref in (auto_map.values() if isinstance(auto_map, dict) else [auto_map])
                        for f in _code_files(ref)})
        found[name] = files or ["(unnamed code)"]
    return found


def check_remote_code(folder: Path, trusted: bool) -> tuple[str, ...]:
    """The Python files the folder will run (empty when none), or RemoteCodeRefusedError in
    one line when it names some and `trusted` is off."""
    found = remote_code_files(folder)
    files = tuple(sorted({f for fs in found.values() for f in fs}))
    if files and not trusted:
        where = "; ".join(f"{name} auto_map -> {', '.join(fs)}" for name, fs in found.items())
        raise RemoteCodeRefusedError(
            f"{folder} runs its own Python code ({where}), which poolwire runs only when told "
            f"to: pass {TRUST_FLAG} if you trust this folder's code, or serve a model that "
            f"transformers supports without it")
    return files
