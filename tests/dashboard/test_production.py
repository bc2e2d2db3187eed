"""The documented production environment: `check --deploy` is clean with it, and behind
the TLS proxy it describes, posts from the public origin pass CSRF and others do not."""

import re

import pytest
import websockets
from websockets.sync.client import connect as ws_connect

from tests import servers

# The README's production environment (the proxy terminates TLS for runwarden.example
# and forwards Host and X-Forwarded-Proto; /metrics is scraped on 127.0.0.1 directly).
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "runwarden-example-secret-key-use-50-or-more-random-characters-0123",
    "ALLOWED_HOSTS": "runwarden.example,127.0.0.1",
    "CSRF_TRUSTED_ORIGINS": "https://runwarden.example",
    "SECURE_PROXY_SSL_HEADER": "1",
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_COOKIES": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "RUNWARDEN_TRUSTED_PROXIES": "127.0.0.1,::1",
}
PUBLIC = {"Host": "runwarden.example", "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}


def test_check_deploy_is_clean_with_the_documented_environment(tmp_path):
    done = servers.manage(servers.environment(tmp_path, **PRODUCTION), "check", "--deploy", "--fail-level", "WARNING",
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout, done.stdout + done.stderr


def test_check_deploy_names_what_is_missing_without_it(tmp_path):
    """The test above can fail: without the TLS settings Django warns."""
    done = servers.manage(servers.environment(tmp_path), "check", "--deploy", "--fail-level", "WARNING", check=False)
    assert done.returncode != 0
    assert "security.W004" in done.stderr + done.stdout  # no HSTS


@pytest.fixture(scope="module")
def production(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("production")
    env = servers.environment(tmp_path, **PRODUCTION)
    servers.migrated_sqlite(tmp_path, env)
    servers.manage(env, "runwarden_user", "create", "ada", "--role", "operator", "--password-stdin",
                   input="correct horse battery\n")
    server = servers.Server(env, tmp_path)
    yield server
    server.stop()


def _login_form(client):
    page = client.get("/accounts/login/", headers=PUBLIC)
    assert page.status_code == 200, page.text
    cookie = re.search(r"csrftoken=([^;]+)", page.headers["set-cookie"]).group(1)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return page, cookie, token


def _post_login(client, origin, cookie, token):
    return client.post("/accounts/login/", headers={**PUBLIC, "Origin": origin, "Cookie": f"csrftoken={cookie}"},
                       data={"csrfmiddlewaretoken": token, "username": "ada", "password": "correct horse battery"})


def test_post_from_the_public_origin_through_the_proxy_is_accepted(production):
    with production.client() as client:
        page, cookie, token = _login_form(client)
        answer = _post_login(client, "https://runwarden.example", cookie, token)
    assert answer.status_code == 302 and answer.headers["location"] == "/", answer.text
    assert "sessionid=" in answer.headers["set-cookie"]
    # Secure cookies, HSTS and the CSP on what the proxy relays.
    assert "secure" in page.headers["set-cookie"].lower()
    assert page.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_post_from_a_foreign_origin_is_refused(production):
    with production.client() as client:
        _, cookie, token = _login_form(client)
        answer = _post_login(client, "https://evil.example", cookie, token)
    assert answer.status_code == 403
    assert "CSRF" in answer.text


def test_plain_http_is_redirected_to_https(production):
    with production.client() as client:
        answer = client.get("/accounts/login/", headers={"Host": "runwarden.example"})
    assert answer.status_code == 301 and answer.headers["location"] == "https://runwarden.example/accounts/login/"


def _session(server):
    with server.client() as client:
        _, cookie, token = _login_form(client)
        answer = _post_login(client, "https://runwarden.example", cookie, token)
    return re.search(r"sessionid=([^;]+)", answer.headers["set-cookie"]).group(1)


def _handshake(server, origin, session):
    """Open the run list socket as a logged-in operator: "open", or the refusal's status."""
    try:
        with ws_connect(f"ws://127.0.0.1:{server.port}/ws/runs/", origin=origin, open_timeout=30,
                        additional_headers={"Cookie": f"sessionid={session}"}):
            return "open"
    except websockets.exceptions.InvalidStatus as refused:
        return refused.response.status_code


def test_websocket_accepts_the_public_origin_behind_a_proxy_that_rewrites_host(production):
    """The proxy may forward Host as 127.0.0.1 (not in CSRF terms the public host); the
    browser's Origin is the public one, and the Origin check accepts it."""
    session = _session(production)
    assert _handshake(production, "https://runwarden.example", session) == "open"
    assert _handshake(production, "https://evil.example", session) == 403
