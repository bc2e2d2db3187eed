#!/usr/bin/env python3
"""Render deploy/nginx/runwarden.conf.template: the one nginx site file for operators and tests.

    python deploy/render_nginx.py --listen 80 --server-name runwarden.example.com \
        --upstream 127.0.0.1:8001 --upstream 127.0.0.1:8002 > /etc/nginx/conf.d/runwarden.conf

Only `${UPPER_CASE}` placeholders are filled; nginx's own `$variables` pass through. A
placeholder without a value is an error, never an empty string in a live config.
Standard library only: it runs with any python3, outside the application's venv.
"""

import argparse
import re
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "nginx" / "runwarden.conf.template"
PLACEHOLDER = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")
UPSTREAM_ADDRESS = re.compile(r"unix:/[^\s;{}]+|[\w.-]+:\d{1,5}|\[[0-9a-fA-F:]+\]:\d{1,5}")
NAME = re.compile(r"[a-z][a-z0-9_]*")
WORDS = re.compile(r"[^;{}\s]+( [^;{}\s]+)*")  # one directive's arguments, nothing that ends it


def render(*, listen, upstreams, server_name="_", upstream="runwarden", template=TEMPLATE):
    """The site file's text. Raises ValueError naming the bad argument."""
    if not upstreams:
        raise ValueError("at least one --upstream is needed")
    for address in upstreams:
        if not UPSTREAM_ADDRESS.fullmatch(address):
            raise ValueError(f"--upstream {address!r} is not HOST:PORT or unix:/PATH")
    if not NAME.fullmatch(upstream):
        raise ValueError(f"--upstream-name {upstream!r} must be lowercase letters, digits and _")
    if not WORDS.fullmatch(str(listen)):
        raise ValueError(f"--listen {listen!r} is not a port or ADDRESS:PORT")
    if not WORDS.fullmatch(server_name):
        raise ValueError(f"--server-name {server_name!r} is not a list of names")
    values = {
        "LISTEN": str(listen),
        "SERVER_NAME": server_name,
        "UPSTREAM": upstream,
        "UPSTREAM_SERVERS": "\n".join(f"    server {a};" for a in upstreams),
    }

    def fill(match):
        try:
            return values[match.group(1)]
        except KeyError:
            raise ValueError(f"{template}: no value for ${{{match.group(1)}}}") from None

    return PLACEHOLDER.sub(fill, Path(template).read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="80", help="nginx `listen` value (default 80)")
    parser.add_argument("--server-name", default="_", help="nginx `server_name` (default _: any)")
    parser.add_argument("--upstream", action="append", default=[], metavar="HOST:PORT",
                        help="a daphne server; repeat once per runwarden-web@ instance")
    parser.add_argument("--upstream-name", default="runwarden", help="nginx upstream block name")
    parser.add_argument("--template", default=TEMPLATE, type=Path)
    args = parser.parse_args(argv)
    try:
        text = render(listen=args.listen, upstreams=args.upstream, server_name=args.server_name,
                      upstream=args.upstream_name, template=args.template)
    except (ValueError, OSError) as error:
        parser.exit(2, f"render_nginx: {error}\n")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
