"""The request-body parser: JSON, bounded, and clean enough for every database.

Checked before any schema sees the data, so a hostile body fails here with a 4xx
instead of deep inside the ORM with a 500:
- more than 1 MiB (declared or actual) → 413;
- not JSON, not UTF-8, NaN/Infinity, or numbers that overflow a float → 400;
- nested deeper than MAX_DEPTH → 400 (Python's decoder and PostgreSQL's jsonb both
  have stack limits);
- a NUL character or a lone surrogate in any string or key → 400 (PostgreSQL text and
  jsonb cannot store either; UTF-8 cannot encode a surrogate).
"""

import json
import math

from ninja.parser import Parser

from runs.api.errors import ApiError, too_large

MAX_BODY_BYTES = 1 << 20  # 1 MiB
MAX_DEPTH = 32


class StrictJSONParser(Parser):
    def parse_body(self, request):
        declared = request.META.get("CONTENT_LENGTH") or "0"
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise too_large(f"the request body is larger than {MAX_BODY_BYTES} bytes")
        body = request.body
        if len(body) > MAX_BODY_BYTES:
            raise too_large(f"the request body is larger than {MAX_BODY_BYTES} bytes")
        return loads(body)


def loads(body):
    """Parse and check one JSON document; ApiError(400) when it is not acceptable."""
    try:
        data = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise _bad(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:  # includes UnicodeDecodeError and JSONDecodeError
        raise _bad(f"not valid JSON: {_short(error)}") from None
    check(data)
    return data


def check(data):
    """Walk `data` without recursion; raise ApiError(400) at the first unusable part."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise _bad(f"JSON nested deeper than {MAX_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_text(key)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)


def _check_text(text):
    if "\x00" in text:
        raise _bad("strings may not contain the NUL character (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad("strings may not contain unpaired surrogates") from None


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _short(error):
    return str(error)[:200]


def _bad(message):
    return ApiError(400, message, code="malformed_body")
