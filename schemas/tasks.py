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


# By name: Task(name) goes through Enum's Python-level __call__ and __new__, a few microseconds
# on every request (bench/service_cost.py's profile); a dict lookup is a fraction of one.
_BY_NAME: dict[str, Task] = {task.value: task for task in Task}


def parse_task(name) -> Task | None:
    """The task a subject's last token names, or None for a name that is no task at all."""
    if isinstance(name, Task):  # Enum hashes a member by its Python name, not its value
        return name
    try:
        return _BY_NAME.get(name)
    except TypeError:  # unhashable: no task
        return None


def in_protocol_order(tasks) -> list[Task]:
    wanted = set(tasks)
    return [t for t in TASK_ORDER if t in wanted]
