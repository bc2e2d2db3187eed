"""The webhook signature: `X-Runwarden-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.

The timestamp is inside what is signed, so a receiver that refuses old timestamps
refuses replays of a captured request; a fresh one is signed at every attempt.
"""

import enum
import hashlib
import hmac
import time

HEADER = "X-Runwarden-Signature"
TOLERANCE_S = 300


class Verdict(enum.Enum):
    VALID = "valid"
    MALFORMED = "malformed"  # no t= or v1=, or t is not a number
    BAD_SIGNATURE = "bad signature"  # another secret, or the body or t was changed
    TOO_OLD = "too old"  # signed longer ago (or further ahead) than the tolerance: a replay


def _mac(secret, body, t):
    return hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret, body, t=None):
    """The header value for `body` (bytes) signed with `secret` at unix time `t` (now)."""
    t = int(time.time()) if t is None else int(t)
    return f"t={t},v1={_mac(secret, body, t)}"


def verify(secret, header, body, *, tolerance_s=TOLERANCE_S, now=None):
    """A Verdict for `header` over `body`: VALID only when some v1 matches and t is
    within `tolerance_s` of `now` (a unix time; default the clock)."""
    fields = [part.strip().partition("=") for part in (header or "").split(",")]
    stamps = [value for key, _, value in fields if key == "t"]
    macs = [value for key, _, value in fields if key == "v1"]
    if len(stamps) != 1 or not stamps[0].isdigit() or not macs:
        return Verdict.MALFORMED
    t = int(stamps[0])
    good = _mac(secret, body, t)
    if not any(hmac.compare_digest(good, mac) for mac in macs):
        return Verdict.BAD_SIGNATURE
    now = time.time() if now is None else now
    if abs(now - t) > tolerance_s:
        return Verdict.TOO_OLD
    return Verdict.VALID
