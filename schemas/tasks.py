"""The five pooling tasks, named as users know them on the wire."""

from enum import Enum


class Task(str, Enum):
    EMBED = "embed"
    CLASSIFY = "classify"
    SCORE = "score"
    TOKEN_EMBED = "token_embed"
    TOKEN_CLASSIFY = "token_classify"

    def __str__(self) -> str:  # so f-strings and log lines show "embed", not "Task.EMBED"
        return self.value


# PROTOCOL.md: `supported_tasks` always lists tasks in this order.
TASK_ORDER: tuple[Task, ...] = (
    Task.EMBED,
    Task.CLASSIFY,
    Task.TOKEN_EMBED,
    Task.TOKEN_CLASSIFY,
    Task.SCORE,
)

TOKEN_LEVEL_TASKS = frozenset({Task.TOKEN_EMBED, Task.TOKEN_CLASSIFY})


def parse_task(name: str) -> Task | None:
    """The task a subject's last token names, or None for a name that is no task at all."""
    try:
        return Task(name)
    except ValueError:
        return None


def in_protocol_order(tasks) -> list[Task]:
    wanted = set(tasks)
    return [t for t in TASK_ORDER if t in wanted]
