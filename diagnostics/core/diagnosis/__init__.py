"""The diagnosis: a window of scrapes and/or a startup log → findings with concrete flag changes.

Use: ``diagnose(prepare(history, info=..., budgets=..., log_text=...))``. :func:`prepare` builds
the :class:`Context` once; :data:`RULES` is the rule table the engine walks.
"""

from diagnostics.core.diagnosis.context import Context, prepare
from diagnostics.core.diagnosis.diff import CommandDiff, command_diff
from diagnostics.core.diagnosis.runner import diagnose, exit_code
from diagnostics.core.diagnosis.table import RULES, Rule
from diagnostics.core.diagnosis.types import Budgets, Finding, KnownFlags, Suggestion, Thresholds

__all__ = [
    "RULES",
    "Budgets",
    "CommandDiff",
    "Context",
    "Finding",
    "KnownFlags",
    "Rule",
    "Suggestion",
    "Thresholds",
    "command_diff",
    "diagnose",
    "exit_code",
    "prepare",
]
