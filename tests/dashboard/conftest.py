import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client


ORIGIN = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]


def make_user(username, *codenames):
    user = User.objects.create_user(username, password="pw-" + username)
    if codenames:
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="runs", codename__in=codenames))
    return User.objects.get(pk=user.pk)  # fresh: no cached permissions


@pytest.fixture
def operator(db):
    return make_user("operator", "view_run", "cancel_run")


@pytest.fixture
def watcher(db):
    """May view runs, may not change them."""
    return make_user("watcher", "view_run")


@pytest.fixture
def stranger(db):
    """Logged in, no permissions at all."""
    return make_user("stranger")


@pytest.fixture
def op_client(operator):
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def watcher_client(watcher):
    client = Client()
    client.force_login(watcher)
    return client


def session_headers(user):
    """Origin and Host as a browser on 127.0.0.1 sends them, plus the user's session."""
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    return [*ORIGIN, (b"cookie", cookie)]


