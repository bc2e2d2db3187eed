"""The account pages: Django's auth views, with password reset only when mail works.

Without EMAIL_HOST a reset form could only fail (an SMTP traceback per request and no
mail): its pages answer 404 and the login page does not link to them.
"""

from functools import wraps

from django.conf import settings
from django.contrib.auth import views as auth_views
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
