"""Make sure the demo operator account exists (used by `make run`).

User `demo`, password from RUNWARDEN_DEMO_PASSWORD, else generated and printed once.
It may view, cancel, retire, retry and approve runs, and open the admin for runs.
"""

import os
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand

USERNAME = "demo"


class Command(BaseCommand):
    help = "Create or update the demo operator account."

    def handle(self, *args, **options):
        User = get_user_model()
        password = os.environ.get("RUNWARDEN_DEMO_PASSWORD", "")
        user, created = User.objects.get_or_create(username=USERNAME, defaults={"is_staff": True})
        if created or password:
            shown = password or secrets.token_urlsafe(12)
            user.set_password(shown)
            user.save()
            if password:
                self.stdout.write(f"Operator account: {USERNAME} (password from RUNWARDEN_DEMO_PASSWORD)")
            else:
                self.stdout.write(f"Operator account created: {USERNAME} / {shown}  (shown once)")
        else:
            self.stdout.write(
                f"Operator account: {USERNAME} (password shown when it was created; "
                "set RUNWARDEN_DEMO_PASSWORD to change it)"
            )
        perms = Permission.objects.filter(
            content_type__app_label="runs", codename__in=["view_run", "cancel_run"]
        )
        user.user_permissions.add(*perms)
