"""Human decisions: recorded against Postgres, signed, parsed off the approvals channel.

- `record`: a decision or answers checked and recorded, first decision wins.
- `signing`: the HMAC a sender signs a message with, and its check.
- `messages`: a channel message parsed and verified, or refused with a reason.
- `stream`: the Redis Stream that keeps channel messages until they are recorded.
- `listener`: the process that reads the channel and records what it hears.
"""

from .record import record_answers, record_decision
from .signing import sign, verify_signature

__all__ = ["record_answers", "record_decision", "sign", "verify_signature"]
