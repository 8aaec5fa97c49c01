"""pipeline/isolate.py: a function runs in a spawned child; its value, user errors and bugs come back."""

from __future__ import annotations

import os

import pytest

from pipeline.errors import CheckFailed, PipelineError, require
from pipeline.isolate import call_in_child


def test_the_function_runs_in_another_process_and_its_value_comes_back() -> None:
    assert call_in_child(os.getpid) != os.getpid()
    assert call_in_child(divmod, 17, 5) == (3, 2)


def test_a_user_error_in_the_child_is_raised_here_unchanged() -> None:
    with pytest.raises(PipelineError, match="^no such thing — make one$") as caught:
        call_in_child(require, False, "no such thing", "make one")
    assert (caught.value.problem, caught.value.fix, caught.value.exit_code) == ("no such thing", "make one", 2)


def test_a_check_failure_keeps_its_type_across_processes() -> None:
    import pickle

    again = pickle.loads(pickle.dumps(CheckFailed("gate failed", "look at the report")))
    assert type(again) is CheckFailed and (again.problem, again.fix, again.exit_code) == ("gate failed", "look at the report", 1)


def test_a_bug_in_the_child_comes_back_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)builtins\.int failed in its child process:.*ValueError: invalid literal"):
        call_in_child(int, "not a number")
