"""What the responder does next about one (alert, policy) whose command is out: wait, time it
out, send it again, or escalate to on-call -- a pure function of the command's audit and the
time, so the policy is tested with a clock that is just a number."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from iotwatch.contract.oncall import CommandAudit, CommandOutcome

#: Outcomes of a command still waiting for its device.
OPEN = frozenset({CommandOutcome.SENT, CommandOutcome.ACCEPTED})
#: Final outcomes that another attempt may fix.
RETRYABLE = frozenset({CommandOutcome.REJECTED, CommandOutcome.FAILED, CommandOutcome.TIMED_OUT})


class Next(StrEnum):
    WAIT = "wait"
    RETRY = "retry"  # send the command again, as attempt + 1
    ESCALATE = "escalate"  # attempts used up: raise a command escalation for on-call


@dataclass(frozen=True)
class CommandNow:
    """The newest audit step of the command, at ``now_ms``."""

    status: CommandOutcome
    attempt: int
    last_step_ms: int  # when its newest step (issue, reply, timeout) happened
    expires_at_ms: int  # the device rejects it as expired after this
    now_ms: int

    @classmethod
    def of(cls, audit: CommandAudit, now_ms: int) -> CommandNow:
        """The command as its latest audit record says, at ``now_ms``."""
        last_step_ms = audit.history[-1].at_ms if audit.history else audit.issued_at_ms
        return cls(audit.status, audit.attempt, last_step_ms, audit.expires_at_ms, now_ms)


def next_step(command: CommandNow, reply_timeout_ms: int, max_attempts: int) -> tuple[bool, Next]:
    """Whether the command times out now, and what follows.

    - a command without a final reply times out ``reply_timeout`` after its last step, but
      only once it expired too: a device that was offline then never runs an attempt the
      responder gave up on;
    - a refused, failed or timed-out attempt is sent again, and so is one the device carried
      out whose alert still fires ``reply_timeout`` later, until ``max_attempts``; then the
      condition is escalated.

    >>> from iotwatch.contract.oncall import CommandOutcome as O
    >>> next_step(CommandNow(O.SENT, 1, 0, 60_000, 30_000), 20_000, 3)
    (False, <Next.WAIT: 'wait'>)
    >>> next_step(CommandNow(O.SENT, 1, 0, 60_000, 60_000), 20_000, 3)
    (True, <Next.RETRY: 'retry'>)
    >>> next_step(CommandNow(O.FAILED, 3, 0, 60_000, 1), 20_000, 3)
    (False, <Next.ESCALATE: 'escalate'>)
    """
    since = command.now_ms - command.last_step_ms
    unanswered = command.status == CommandOutcome.SENT and command.now_ms < command.expires_at_ms
    timed_out = command.status in OPEN and since >= reply_timeout_ms and not unanswered
    status = CommandOutcome.TIMED_OUT if timed_out else command.status
    if status in RETRYABLE or (status == CommandOutcome.DONE and since >= reply_timeout_ms):
        return timed_out, Next.RETRY if command.attempt < max_attempts else Next.ESCALATE
    return timed_out, Next.WAIT
