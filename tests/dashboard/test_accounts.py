"""Log-in throttling, password reset only with mail, and operator accounts."""

import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

PASSWORD = "the right password"


@pytest.fixture
def ada(db):
    return User.objects.create_user("ada", password=PASSWORD)


def log_in(client, password, username="ada", **headers):
    return client.post("/accounts/login/", {"username": username, "password": password}, **headers)


def logged_in(client):
    return "_auth_user_id" in client.session


# --- throttling --------------------------------------------------------------------------


def test_forty_wrong_passwords_then_the_right_one_is_refused(ada):
    client = Client()
    for _ in range(40):
        log_in(client, "wrong")
    answer = log_in(client, PASSWORD)
    assert answer.status_code == 429
    assert "Too many failed log-ins" in answer.content.decode()
    assert not logged_in(client)


def test_under_the_limit_the_right_password_logs_in(ada):
    client = Client()
    for _ in range(4):  # the default limit is 5
        assert log_in(client, "wrong").status_code == 200
    answer = log_in(client, PASSWORD)
    assert answer.status_code == 302 and logged_in(client)


def test_lockout_is_per_user_name_and_address(ada):
    User.objects.create_user("grace", password=PASSWORD)
    attacker = Client(REMOTE_ADDR="198.51.100.9")
    for _ in range(10):
        log_in(attacker, "wrong")
    assert log_in(attacker, PASSWORD).status_code == 429
    elsewhere = Client(REMOTE_ADDR="198.51.100.10")
    assert log_in(elsewhere, PASSWORD).status_code == 302  # ada from another address
    other_user = Client(REMOTE_ADDR="198.51.100.9")
    assert log_in(other_user, PASSWORD, username="grace").status_code == 302


def test_forwarded_address_is_ignored_unless_the_proxy_is_trusted(ada):
    """Without a trusted proxy a client cannot pick a fresh address per attempt."""
    client = Client()
    for i in range(10):
        log_in(client, "wrong", HTTP_X_FORWARDED_FOR=f"203.0.113.{i}")
    assert log_in(client, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.99").status_code == 429


@override_settings(RUNWARDEN_TRUSTED_PROXIES=[__import__("ipaddress").ip_network("127.0.0.1/32")])
def test_behind_a_trusted_proxy_the_forwarded_client_is_throttled(ada):
    client = Client()  # REMOTE_ADDR 127.0.0.1: the proxy
    for _ in range(10):
        log_in(client, "wrong", HTTP_X_FORWARDED_FOR="spoofed, 203.0.113.5")
    assert log_in(client, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.5").status_code == 429
    # Another client behind the same proxy is not locked out.
    assert log_in(client, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.6").status_code == 302


# --- password reset ------------------------------------------------------------------------


@override_settings(EMAIL_HOST="")
def test_password_reset_is_off_without_mail(db):
    client = Client()
    assert client.get("/accounts/password_reset/").status_code == 404
    assert client.post("/accounts/password_reset/", {"email": "a@example.com"}).status_code == 404
    assert "password_reset" not in client.get("/accounts/login/").content.decode()


@override_settings(EMAIL_HOST="smtp.example", EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend")
def test_password_reset_is_linked_and_served_with_mail(db):
    client = Client()
    assert 'href="/accounts/password_reset/"' in client.get("/accounts/login/").content.decode()
    assert client.get("/accounts/password_reset/").status_code == 200


# --- operator accounts ---------------------------------------------------------------------


def create(*args, stdin=None):
    out = io.StringIO()
    if stdin is not None:
        import sys

        saved, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        call_command("runwarden_user", *args, stdout=out)
    finally:
        if stdin is not None:
            sys.stdin = saved
    return out.getvalue()


@pytest.mark.parametrize("role,can_cancel", [("viewer", False), ("operator", True)])
def test_created_user_has_the_role_s_permissions(db, role, can_cancel):
    create("create", "kim", "--role", role, "--password-stdin", stdin="s3cret-enough\n")
    user = User.objects.get(username="kim")
    assert user.check_password("s3cret-enough")
    assert user.has_perm("runs.view_run")
    assert user.has_perm("runs.cancel_run") is can_cancel
    assert not user.is_staff


def test_roles_and_the_command_are_idempotent_and_generated_passwords_shown_once(db):
    out = create("create", "kim", "--role", "viewer")
    assert "shown once" in out
    create("role", "kim", "--role", "operator")
    create("role", "kim", "--role", "operator")
    user = User.objects.get(username="kim")
    assert [g.name for g in user.groups.all()] == ["operators"]
    assert user.has_perm("runs.cancel_run")
    assert sorted(p.codename for p in Group.objects.get(name="viewers").permissions.all()) == ["view_run"]
    assert sorted(p.codename for p in Group.objects.get(name="operators").permissions.all()) == ["cancel_run", "view_run"]


def test_viewer_may_look_but_not_abort(db, make_run):
    create("create", "vic", "--role", "viewer", "--password-stdin", stdin="s3cret-enough\n")
    client = Client()
    assert log_in(client, "s3cret-enough", username="vic").status_code == 302
    run = make_run()
    assert client.get(f"/runs/{run.pk}/").status_code == 200
    assert client.post(f"/runs/{run.pk}/cancel").status_code == 403


def test_refusals_are_command_errors(db):
    create("create", "kim", "--role", "viewer", "--password-stdin", stdin="s3cret-enough\n")
    with pytest.raises(CommandError, match="exists"):
        create("create", "kim", "--role", "viewer", "--password-stdin", stdin="s3cret-enough\n")
    with pytest.raises(CommandError, match="no user 'nobody'"):
        create("role", "nobody", "--role", "viewer")
    with pytest.raises(CommandError, match="password refused"):
        create("create", "lee", "--role", "viewer", "--password-stdin", stdin="short\n")
