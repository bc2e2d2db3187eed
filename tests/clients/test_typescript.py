"""The TypeScript client: its `node --test` suite against a real server, and its wire
types against the server's OpenAPI schema.

`make install` runs `npm ci && npm run build` in clients/typescript; nothing is
downloaded here. Without Node, or before that build, these skip and say why."""

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from runs.api.auth import create_key

TS = Path(__file__).resolve().parents[2] / "clients" / "typescript"
NODE = shutil.which("node")
built = pytest.mark.skipif(
    NODE is None or not (TS / "dist" / "index.js").exists() or not (TS / "node_modules").exists(),
    reason="needs Node >= 20 and the built client: make install (npm ci && npm run build in clients/typescript)",
)


@built
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("control", ["long-poll", "socket"])
def test_the_node_suite_passes_against_a_real_server(live_server_url, answering, control):
    # Node 20 has WebSocket behind a flag: with it the client takes the ticketed socket
    # (as in a browser), without it the long-poll; the suite checks which one it used.
    answering("ts-agent", lambda request: str((request.get("args") or {}).get("path", "")).startswith("/tmp/"))
    env = {**os.environ, "RUNWARDEN_URL": live_server_url, "RUNWARDEN_KEY": create_key("ts-agent")[1],
           "RUNWARDEN_OPERATOR_KEY": create_key("ts-ops", "operator")[1],
           "RUNWARDEN_EXPECT_SOCKET": "1" if control == "socket" else "0"}
    flags = ["--experimental-websocket"] if control == "socket" else []
    # Each node test has a timeout of its own, so a hung one fails by name and the rest run.
    done = subprocess.run([NODE, *flags, "--test", "--test-timeout=60000", "--test-reporter=spec", "test/"],
                          cwd=TS, env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "# fail 0" in done.stdout or "ℹ fail 0" in done.stdout, done.stdout[-3000:]


@built
@pytest.mark.django_db(transaction=True)
def test_the_types_match_the_openapi_schema(live_server_url):
    schema = httpx.get(f"{live_server_url}/api/v1/openapi.json", timeout=30).raise_for_status().text
    generated = subprocess.run([NODE, "scripts/gen-types.mjs"], cwd=TS, input=schema, capture_output=True,
                               text=True, timeout=60, check=True).stdout
    committed = (TS / "src" / "schema.ts").read_text()
    assert generated == committed, (
        "clients/typescript/src/schema.ts drifted from /api/v1/openapi.json: regenerate it "
        "(curl …/api/v1/openapi.json | node scripts/gen-types.mjs > src/schema.ts) and rebuild")


@built
def test_the_client_type_checks():
    done = subprocess.run([str(TS / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json", "--noEmit"], cwd=TS,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
