"""What a person's name in the audit trail (`--by`) may be.

An actor name is recorded in the log for good and shown by every reader, so it must not be
able to dress itself up as something else (ADR 0021): 1 to 200 characters; letters and digits
of any script, spaces, and the punctuation `. _ - @ + : / ' ( ) , # &`; no leading or
trailing space. That rules out control characters and terminal escapes, invisible and
direction-changing characters, and markup brackets, whatever the output does.
"""

from __future__ import annotations

from steptrail.domain.errors import InvalidActor

MAX_ACTOR_LENGTH = 200
PUNCTUATION = frozenset(" ._-@+:/'(),#&")


def check_actor(name: str) -> str:
    """`name`, if it is an acceptable actor name.

    Raises:
        InvalidActor: saying what is wrong with it (never echoing it raw).
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidActor("an actor name (--by) names who acted; it cannot be empty")
    if len(name) > MAX_ACTOR_LENGTH:
        raise InvalidActor(
            f"an actor name (--by) has at most {MAX_ACTOR_LENGTH} characters, not {len(name)}"
        )
    if name != name.strip():
        raise InvalidActor("an actor name (--by) cannot start or end with white space")
    bad = sorted({c for c in name if not (c.isalnum() or c in PUNCTUATION)})
    if bad:
        shown = ", ".join(ascii(c) for c in bad[:5])
        raise InvalidActor(
            "an actor name (--by) may hold letters, digits, spaces and . _ - @ + : / ' ( ) "
            f", # & only; it holds {shown}"
        )
    return name
