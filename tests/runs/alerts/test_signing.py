"""sign() and verify(): the HMAC over "<t>.<body>", and the replay window."""

import hashlib
import hmac

from runs.alerts.signing import Verdict, sign, verify

BODY = b'{"event":"stuck"}'


def test_the_signature_is_the_hmac_of_t_dot_body():
    expected = hmac.new(b"k", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert sign("k", BODY, 1700000000) == f"t=1700000000,v1={expected}"


def test_verify_accepts_a_fresh_signature_and_names_what_is_wrong_otherwise():
    header = sign("k", BODY, 1000)
    assert verify("k", header, BODY, now=1000 + 299) == Verdict.VALID
    assert verify("k", header, BODY + b" ", now=1000) == Verdict.BAD_SIGNATURE
    assert verify("other", header, BODY, now=1000) == Verdict.BAD_SIGNATURE
    assert verify("k", header, BODY, now=1000 + 301) == Verdict.TOO_OLD
    assert verify("k", header, BODY, now=1000 - 301) == Verdict.TOO_OLD  # from the future: a wrong clock
    assert verify("k", header.replace("t=1000", "t=1001"), BODY, now=1000) == Verdict.BAD_SIGNATURE
    for broken in ["", "v1=abc", "t=x,v1=abc", "t=1000", "t=1,t=2,v1=a"]:
        assert verify("k", broken, BODY, now=1000) == Verdict.MALFORMED


def test_verify_takes_any_of_several_v1_during_a_secret_rotation():
    old = sign("old", BODY, 1000).split(",")[1]
    assert verify("new", f"{sign('new', BODY, 1000)},{old}", BODY, now=1000) == Verdict.VALID
