"""docs/PROTOCOL.md against the code, where the code is the source of truth: error codes and their
statuses, task names and their protocol order, request keys and defaults, deprecation event
fields. No NATS, no model: the doc's markdown tables are parsed as plain text.

Each check returns the problems it finds rather than asserting, so the last tests can feed it a
doc with a row removed and prove the check would notice."""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from poolwire.schemas.errors import ErrorCode
from poolwire.schemas.events import DEPRECATION_EVENT, DeprecationEvent
from poolwire.schemas.requests import PoolingRequest
from poolwire.schemas.tasks import TASK_ORDER, Task

DOC = Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md"
_KEY_CELL = re.compile(r"^`([^`]+)`$")


@dataclass
class Table:
    section: str  # the `## ` heading above it
    header: list[str]
    rows: dict[str, list[str]]  # first cell's backticked name -> all cells


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[Table]:
    """Every table: a run of lines starting with `|`; its first line is the header, the `---`
    line is skipped, and a row counts only when its first cell is one name in backticks."""
    found: list[Table] = []
    section, current = "", None
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        if not line.startswith("|"):
            current = None
            continue
        row = cells(line)
        if current is None:
            current = Table(section, row, {})
            found.append(current)
        elif m := _KEY_CELL.match(row[0]):
            current.rows[m.group(1)] = row
    return found


def table(text: str, section: str, first_column: str) -> Table:
    matches = [t for t in tables(text) if t.section == section and t.header[0] == first_column]
    assert len(matches) == 1, f"expected one table '{first_column}' under '## {section}'"
    return matches[0]


def error_problems(text: str) -> list[str]:
    t = table(text, "Errors", "code")
    status = t.header.index("status")
    problems = [f"error code {c.value} has no row" for c in ErrorCode if c.value not in t.rows]
    problems += [f"{c.value}: doc says status {t.rows[c.value][status]}, code says {c.status}"
                 for c in ErrorCode if c.value in t.rows and t.rows[c.value][status] != str(c.status)]
    known = {c.value for c in ErrorCode}
    problems += [f"doc lists error code {name} the code does not have"
                 for name in t.rows if name not in known]
    return problems


def task_problems(text: str) -> list[str]:
    subjects = table(text, "Subjects", "subject").rows
    problems = [f"task {t.value} has no subject row P.{t.value}"
                for t in TASK_ORDER if f"P.{t.value}" not in subjects]
    problems += [f"task {t.value} is missing from TASK_ORDER" for t in Task if t not in TASK_ORDER]
    lines = [line for line in text.splitlines() if line.startswith("**Protocol order:**")]
    if len(lines) != 1:
        return problems + ["no single '**Protocol order:**' line"]
    listed = re.findall(r"`([^`]+)`", lines[0])
    expected = [t.value for t in TASK_ORDER]
    if listed != expected:
        problems.append(f"protocol order in the doc is {listed}, TASK_ORDER is {expected}")
    return problems


def _wire(value) -> str:
    return json.dumps(value)  # how the doc writes a default: true, 0, "right"


def request_key_problems(text: str) -> list[str]:
    # Code is a subset of the doc: the remaining 1.1 keys are documented before they are coded.
    t = table(text, "Request keys", "key")
    default = t.header.index("default")
    problems = [f"request field {name} has no row"
                for name in PoolingRequest.model_fields if name not in t.rows]
    for name, field in PoolingRequest.model_fields.items():
        if name in t.rows and field.default is not None \
                and _wire(field.default) not in t.rows[name][default]:
            problems.append(f"{name}: code default {_wire(field.default)} is not in the doc's "
                            f"default cell {t.rows[name][default]!r}")
    return problems


def event_problems(text: str) -> list[str]:
    t = table(text, "Deprecation events", "field")
    problems = [f"event field {name} has no row"
                for name in DeprecationEvent.model_fields if name not in t.rows]
    if f"`{DEPRECATION_EVENT}`" not in t.rows.get("event", [""])[-1]:
        problems.append(f"the event row does not name {DEPRECATION_EVENT}")
    return problems


CHECKS = [error_problems, task_problems, request_key_problems, event_problems]


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_doc_names_the_protocol_version(doc):
    assert "version 1.3" in doc.split("\n## ")[0]


# Version 1.3's additions, documented before every one of them is in the code (the code-vs-doc
# checks above only ask the doc to cover what the code has, so they cannot see these).
V1_3 = {("Request keys", "key"): {"outputs", "adapter", "instruction"},
        ("Discovery", "key"): {"modalities", "outputs", "adapters", "hybrid_weights"}}


@pytest.mark.parametrize("section, first_column", list(V1_3), ids=lambda v: v)
def test_doc_has_the_1_3_rows(doc, section, first_column):
    rows = table(doc, section, first_column).rows
    assert V1_3[section, first_column] - rows.keys() == set()


def test_doc_describes_1_3_inputs_and_models(doc):
    headings = {line.lstrip("#").strip() for line in doc.splitlines() if line.startswith("### ")}
    assert {"Images (multimodal models, 1.3)", "Several outputs (BGE-M3, 1.3)",
            "Rerankers that score with token logits (1.3)", "Adapters (1.3)"} <= headings
    for name in ('`{"image": <bytes>}`', '`{"image_ref": {"bucket": B, "name": N}}`',
                 "`token-logits`", "`hybrid`", "`--trust-remote-code`"):
        assert name in doc, name


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_doc_agrees_with_code(doc, check):
    assert check(doc) == []


def _without_row(doc: str, section: str, first_cell: str) -> str:
    """The doc with one table row removed (only under `section`)."""
    head, _, rest = doc.partition(f"\n## {section}\n")
    body, sep, tail = rest.partition("\n## ")
    lines = body.splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(f"| `{first_cell}` |")]
    assert len(kept) == len(lines) - 1, f"no row `{first_cell}` under {section}"
    return head + f"\n## {section}\n" + "".join(kept) + sep + tail


@pytest.mark.parametrize("check, section, row", [
    (error_problems, "Errors", "overloaded"),
    (task_problems, "Subjects", "P.token_classify"),
    (request_key_problems, "Request keys", "priority"),
    (request_key_problems, "Request keys", "text_2"),
    (event_problems, "Deprecation events", "hint"),
], ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", None))
def test_checks_notice_a_missing_row(doc, check, section, row):
    problems = check(_without_row(doc, section, row))
    assert problems and all(row in p for p in problems), problems


def test_checks_notice_a_wrong_status(doc):
    changed = doc.replace("| `deadline_exceeded` | 504 |", "| `deadline_exceeded` | 503 |")
    assert changed != doc
    assert error_problems(changed) == ["deadline_exceeded: doc says status 503, code says 504"]


def test_checks_notice_a_reordered_protocol_order(doc):
    changed = doc.replace("`token_embed`, `token_classify`, `score`.",
                          "`token_embed`, `score`, `token_classify`.")
    assert changed != doc
    assert any("protocol order" in p for p in task_problems(changed))


def test_checks_notice_a_wrong_default(doc):
    changed = doc.replace('| all | `"right"` |', '| all | `"left"` |')
    assert changed != doc
    assert any("truncation_side" in p for p in request_key_problems(changed))
