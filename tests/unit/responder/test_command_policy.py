"""The responder's command policy on a clock that is a number: when an unanswered command
times out, when an attempt is repeated, when the condition is escalated -- without sleeping."""

from __future__ import annotations

from iotwatch.contract.oncall import CommandOutcome as Outcome
from iotwatch.responder.command_policy import CommandNow, Next, next_step

TIMEOUT_MS, ATTEMPTS = 20_000, 3


def step(status: Outcome, now_ms: int, attempt: int = 1, last_step_ms: int = 0, expires_at_ms: int = 60_000):
    return next_step(CommandNow(status, attempt, last_step_ms, expires_at_ms, now_ms), TIMEOUT_MS, ATTEMPTS)


def test_an_unanswered_command_times_out_only_once_it_has_expired_too() -> None:
    assert step(Outcome.SENT, 19_999) == (False, Next.WAIT)
    assert step(Outcome.SENT, 59_999) == (False, Next.WAIT)  # past the reply timeout, not yet expired
    assert step(Outcome.SENT, 60_000) == (True, Next.RETRY)


def test_an_accepted_command_times_out_after_the_reply_timeout_from_its_last_step() -> None:
    assert step(Outcome.ACCEPTED, 29_999, last_step_ms=10_000) == (False, Next.WAIT)
    assert step(Outcome.ACCEPTED, 30_000, last_step_ms=10_000) == (True, Next.RETRY)


def test_a_refused_or_failed_attempt_is_repeated_at_once_until_the_attempts_are_used_up() -> None:
    for outcome in (Outcome.REJECTED, Outcome.FAILED, Outcome.TIMED_OUT):
        assert step(outcome, 1, attempt=1) == (False, Next.RETRY)
        assert step(outcome, 1, attempt=ATTEMPTS - 1) == (False, Next.RETRY)
        assert step(outcome, 1, attempt=ATTEMPTS) == (False, Next.ESCALATE)


def test_a_done_command_whose_condition_persists_is_repeated_after_the_reply_timeout() -> None:
    assert step(Outcome.DONE, 19_999) == (False, Next.WAIT)
    assert step(Outcome.DONE, 20_000) == (False, Next.RETRY)
    assert step(Outcome.DONE, 20_000, attempt=ATTEMPTS) == (False, Next.ESCALATE)


def test_an_escalated_command_waits() -> None:
    assert step(Outcome.ESCALATED, 10**9, attempt=ATTEMPTS) == (False, Next.WAIT)
