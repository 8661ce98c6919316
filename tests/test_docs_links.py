"""README.md and the guides in docs/ against the repository: every relative link names a file that
exists (and a heading of it, when it has an anchor), and every `make <target>` and `poolwire
<subcommand> --option` they show is a Makefile target, a subcommand of the CLI's own argparse
parser and one of that subcommand's options. No NATS, no model.

Each check returns the problems it finds, so the last tests feed it a page with a fault and
prove it would notice."""

import argparse
import re
from pathlib import Path

import pytest

from poolwire.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_INLINE = re.compile(r"`([^`]+)`")
# `poolwire <subcommand>` as a command: at the start, after a path (.venv/bin/) or a space;
# never `poolwire.x`, `poolwire_x`, `poolwire:` or `from poolwire import`.
_POOLWIRE = re.compile(r"(?:^|(?<=[\s/]))poolwire[ \t]+([a-z][a-z_-]*)(.*)$", re.S)
_MAKE = re.compile(r"(?:^|(?<=\s))make[ \t]+([a-z][\w-]*)")
_OPTION = re.compile(r"(?:^|(?<=\s))(--[a-z][\w.-]*)")
_END_OF_COMMAND = re.compile(r"\|\||&&|[|;&]")
_COMMENT = re.compile(r"(?:^|\s)#(?:\s.*)?$")


def split(text: str) -> tuple[list[str], str]:
    """The shell commands of a page (fenced blocks other than python, indented blocks, inline
    code spans; continuation lines joined), and its prose (everything outside code blocks)."""
    commands, prose, lines = [], [], text.splitlines()
    fenced, language = False, ""
    for line in lines:
        if _FENCE.match(line):
            fenced, language = (not fenced), line[3:].strip()
            continue
        if fenced:
            if language not in ("python", "py", "go", "json"):
                commands.append(line)
        elif line.startswith("    ") and line.strip():
            commands.append(line)
        else:
            prose.append(line)
    body = "\n".join(prose)
    commands += [span.replace("\n", " ") for span in _INLINE.findall(body)]
    joined = "\n".join(commands).replace("\\\n", " ")
    return joined.splitlines(), body


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        if fenced or not (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def link_problems(page: Path, text: str) -> list[str]:
    _, prose = split(text)
    problems = []
    for target in _LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        if not file_part:
            if anchor not in anchors(text):
                problems.append(f"{page.name}: link {target}: {page.name} has no heading #{anchor}")
            continue
        path = (page.parent / file_part).resolve()
        if not path.exists():
            problems.append(f"{page.name}: link {target} names no file")
        elif anchor and path.suffix == ".md" \
                and anchor not in anchors(path.read_text(encoding="utf-8")):
            problems.append(f"{page.name}: link {target}: {path.name} has no heading #{anchor}")
    return problems


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def cli_options() -> dict[str, set[str]]:
    parser, _ = build_parser()
    options = {name: _options(sub) for name, sub in _subparsers(parser).items()}
    # `poolwire bench` hands its arguments to bench/throughput.py, whose parser owns them.
    from bench.throughput import build_parser as bench_parser
    options["bench"] = _options(bench_parser())
    return options


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M)}


def command_problems(page: Path, text: str, options: dict[str, set[str]],
                     targets: set[str]) -> list[str]:
    problems = []
    commands, _ = split(text)
    for line in commands:
        if line.lstrip().startswith("poolwire:"):
            continue  # what a worker prints ("poolwire: ..."), not a command to check
        line = _COMMENT.sub("", line)
        for target in _MAKE.findall(line):
            if target not in targets:
                problems.append(f"{page.name}: `make {target}`: no such Makefile target")
        for m in _POOLWIRE.finditer(line):
            sub, rest = m.group(1), _END_OF_COMMAND.split(m.group(2))[0]
            if sub not in options:
                problems.append(f"{page.name}: `poolwire {sub}`: no such subcommand")
                continue
            for option in _OPTION.findall(rest):
                if option.split("=")[0] not in options[sub]:
                    problems.append(f"{page.name}: `poolwire {sub} {option}`: no such option")
    return problems


@pytest.fixture(scope="module")
def options():
    return cli_options()


@pytest.fixture(scope="module")
def targets():
    return make_targets()


def test_the_guides_exist():
    names = {p.name for p in PAGES}
    assert {"README.md", "PROTOCOL.md", "MODELS.md", "REQUESTS.md", "CONFIGURATION.md",
            "SECURITY.md", "DURABLE.md", "OPERATIONS.md", "PERFORMANCE.md", "DEPLOYMENT.md",
            "SCALING.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    assert link_problems(page, page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_exists(page, options, targets):
    assert command_problems(page, page.read_text(encoding="utf-8"), options, targets) == []


def test_the_readme_reaches_every_guide():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _LINK.findall(readme)}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == [], f"README.md links to no {missing}"


def test_the_readme_is_one_page():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_the_readme_keeps_the_two_commands():
    commands, _ = split((ROOT / "README.md").read_text(encoding="utf-8"))
    assert any(line.startswith("make run ") for line in commands)
    assert any(line.startswith("make test ") for line in commands)


# The checks themselves notice faults.

PAGE = ROOT / "docs" / "EXAMPLE.md"


@pytest.mark.parametrize("text, fault", [
    ("See [the guide](MISSING.md).", "MISSING.md names no file"),
    ("See [models](MODELS.md#no-such-heading).", "has no heading #no-such-heading"),
    ("See [here](#nowhere).", "has no heading #nowhere"),
])
def test_link_check_notices(text, fault):
    problems = link_problems(PAGE, text)
    assert len(problems) == 1 and fault in problems[0], problems


def test_link_check_passes_good_links():
    text = ("[a](MODELS.md#offline-the-same-model-in-this-process) [b](../RELIABILITY.md) "
            "[c](https://example.com/x) [d](PROTOCOL.md#request-keys)")
    assert link_problems(PAGE, text) == []


@pytest.mark.parametrize("text, fault", [
    ("```\nmake deploy\n```", "`make deploy`"),
    ("```\n.venv/bin/poolwire embedd hello\n```", "`poolwire embedd`"),
    ("Run `poolwire serve --no-such-flag 3`.", "`poolwire serve --no-such-flag`"),
    ("    poolwire serve --durable \\\n        --pipeline-nothing x", "--pipeline-nothing"),
    ("Split `poolwire rerank Q D\n--top-k 3` across lines.", "`poolwire rerank --top-k`"),
    ("`poolwire bench --no-such-bench-flag`", "`poolwire bench --no-such-bench-flag`"),
])
def test_command_check_notices(text, fault, options, targets):
    problems = command_problems(PAGE, text, options, targets)
    assert len(problems) == 1 and fault in problems[0], problems


def test_command_check_passes_good_commands(options, targets):
    text = ("```\nmake run    # make believe\npoolwire stats --prefix pooling --json | head\n```\n"
            "```python\nfrom poolwire import PoolingClient\n```\n"
            "`poolwire serve --pooler-config.task embed`, queue group `poolwire`, `poolwire_x`.")
    assert command_problems(PAGE, text, options, targets) == []
