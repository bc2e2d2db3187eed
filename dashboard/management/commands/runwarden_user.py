"""Operator accounts: `manage.py runwarden_user create NAME --role viewer|operator`.

Roles are groups, created (or completed) on every call, so the command is safe to rerun:
- viewers: runs.view_run (see every page, change nothing)
- operators: runs.view_run + runs.cancel_run (abort, retire, retry, approve, bulk)

The password comes from stdin (`--password-stdin`, one line: nothing in the shell
history or the process list), else it is generated and printed once.
Exit codes: 0 done, 1 refused (the user exists, an empty password), 2 unknown user.
"""

import secrets
import sys

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.password_validation import ValidationError, validate_password
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

ROLES = {
    "viewer": ("viewers", ["view_run"]),
    "operator": ("operators", ["view_run", "cancel_run"]),
}


def ensure_groups():
    """The role groups with exactly their permissions; {role: group}."""
    groups = {}
    for role, (name, codenames) in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        perms = Permission.objects.filter(content_type__app_label="runs", codename__in=codenames)
        group.permissions.set(perms)
        groups[role] = group
    return groups


class Command(BaseCommand):
    help = "Create viewer and operator accounts, or change a user's role."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a user with a role")
        create.add_argument("username")
        create.add_argument("--role", choices=sorted(ROLES), required=True)
        create.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
        role = sub.add_parser("role", help="give an existing user a role (replacing the other)")
        role.add_argument("username")
        role.add_argument("--role", choices=sorted(ROLES), required=True)
        password = sub.add_parser("password", help="set an existing user's password")
        password.add_argument("username")
        password.add_argument("--password-stdin", action="store_true", help="read the password from stdin")

    def handle(self, *args, action, username, **options):
        User = get_user_model()
        with transaction.atomic():
            groups = ensure_groups()
            if action == "create":
                if User.objects.filter(username=username).exists():
                    raise CommandError(f"user {username!r} exists; use `runwarden_user role` or `password`", returncode=1)
                secret, shown = self._password(options["password_stdin"])
                user = User(username=username)
                self._check(secret, user)
                user.set_password(secret)
                user.save()
                user.groups.add(groups[options["role"]])
                self.stdout.write(f"Created {options['role']} {username}" + (f" / {secret}  (shown once)" if shown else ""))
                return
            user = User.objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"no user {username!r}", returncode=2)
            if action == "role":
                user.groups.remove(*groups.values())
                user.groups.add(groups[options["role"]])
                self.stdout.write(f"{username} is now a {options['role']}")
            else:
                secret, shown = self._password(options["password_stdin"])
                self._check(secret, user)
                user.set_password(secret)
                user.save()
                self.stdout.write(f"Password set for {username}" + (f": {secret}  (shown once)" if shown else ""))

    def _password(self, from_stdin):
        if not from_stdin:
            return secrets.token_urlsafe(12), True
        secret = sys.stdin.readline().rstrip("\r\n")
        if not secret:
            raise CommandError("--password-stdin: stdin gave an empty password", returncode=1)
        return secret, False

    def _check(self, secret, user):
        try:
            validate_password(secret, user)
        except ValidationError as error:
            raise CommandError("password refused: " + " ".join(error.messages), returncode=1) from None
