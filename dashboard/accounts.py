"""The account pages: Django's auth views, with password reset only when mail works.

Without EMAIL_HOST a reset form could only fail (an SMTP traceback per request and no
mail): its pages answer 404 and the login page does not link to them.

A live page's socket was authenticated once, at its handshake; it would go on
streaming run data after its session ended. Each socket therefore joins a group for
its session and one for its user: logging out closes the session's sockets, and a
user made inactive (or deleted) has all of theirs closed (code 4403, "log in again").
"""

import hashlib
from functools import wraps

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import Http404
from django.urls import path


def password_reset_enabled():
    return bool(settings.EMAIL_HOST)


def needs_mail(view):
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not password_reset_enabled():
            raise Http404("Password reset is off: no mail server is configured (EMAIL_HOST).")
        return view(request, *args, **kwargs)

    return wrapper


SESSION_ENDED = {"type": "session.ended"}


def session_group(session_key):
    """The group of a session's sockets; the key is hashed (it is a credential, and
    group names are logged and travel to Redis)."""
    return "session-" + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def user_group(user_id):
    return f"user-{user_id}"


def end_sockets(*groups):
    from runs import broadcast  # best effort, after the fact: a layer outage must not fail a logout

    broadcast.send_all([(group, SESSION_ENDED) for group in groups])


@receiver(user_logged_out, dispatch_uid="runwarden-close-sockets-on-logout")
def _logged_out(sender, request, user, **kwargs):
    if request is not None and request.session.session_key:
        end_sockets(session_group(request.session.session_key))


@receiver(post_save, sender=get_user_model(), dispatch_uid="runwarden-close-sockets-of-inactive")
def _saved(sender, instance, created, **kwargs):
    if not created and not instance.is_active:
        end_sockets(user_group(instance.pk))


@receiver(post_delete, sender=get_user_model(), dispatch_uid="runwarden-close-sockets-of-deleted")
def _deleted(sender, instance, **kwargs):
    end_sockets(user_group(instance.pk))


def login(request, *args, **kwargs):
    view = auth_views.LoginView.as_view(extra_context={"password_reset": password_reset_enabled()})
    return view(request, *args, **kwargs)


urlpatterns = [
    path("login/", login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("password_change/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("password_reset/", needs_mail(auth_views.PasswordResetView.as_view()), name="password_reset"),
    path("password_reset/done/", needs_mail(auth_views.PasswordResetDoneView.as_view()), name="password_reset_done"),
    path("reset/<uidb64>/<token>/", needs_mail(auth_views.PasswordResetConfirmView.as_view()),
         name="password_reset_confirm"),
    path("reset/done/", needs_mail(auth_views.PasswordResetCompleteView.as_view()), name="password_reset_complete"),
]
