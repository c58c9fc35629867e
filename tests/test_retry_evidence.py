"""A retry's 429 counts only in a window in which the provider answered nothing else."""

from __future__ import annotations

from planner.classify import LimitType
from planner.retry_evidence import unanswered_retry_throttles

REQ, UNK = LimitType.REQUESTS, LimitType.UNKNOWN


def test_retries_alone_with_nothing_answered_count_once_per_type() -> None:
    retried = [UNK, REQ, UNK, UNK]

    assert unanswered_retry_throttles(retried, first_429s=0, answered=0) == [REQ, UNK]


def test_an_answer_or_a_first_429_in_the_window_leaves_retries_silent() -> None:
    assert unanswered_retry_throttles([UNK], first_429s=0, answered=1) == []
    assert unanswered_retry_throttles([UNK], first_429s=1, answered=0) == []


def test_no_retries_no_throttles() -> None:
    assert unanswered_retry_throttles([], first_429s=0, answered=0) == []
