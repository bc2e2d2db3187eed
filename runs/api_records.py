"""The agent API's records: keys (and the agent names each may run), the creator of a
run made through the API, idempotency records, control-socket tickets and the in-flight
text of API runs. Models of the `runs` app (migrations know them as `runs.*`)."""

from django.db import models
from django.db.models import Q


class ApiKey(models.Model):
    """A key an external agent (or an operator's tool) authenticates with.

    Only the key's SHA-256 is stored; the key itself is printed once, at creation.
    An API client acts as the worker `api:<name>`, so a key acts only on runs that
    identity created or claimed. A revoked key stays as a row (its name may be reused).
    """

    class Scope(models.TextChoices):
        AGENT = "agent", "agent"  # acts only on runs it created or claimed
        OPERATOR = "operator", "operator"  # may also read any run, cancel and retire

    name = models.CharField(max_length=64)
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.AGENT)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)  # shown in listings to tell keys apart
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Agent names an agent key may create and claim runs of; "*" is any name but the
    # built-in engine's (those run on the server's provider key: named explicitly only).
    agents = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["name", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"], condition=Q(revoked_at__isnull=True), name="apikey_unique_active_name"
            ),
            models.CheckConstraint(name="apikey_scope_valid", condition=Q(scope__in=["agent", "operator"])),
        ]

    def __str__(self):
        return f"{self.name} ({self.scope}{', revoked' if self.revoked_at else ''})"

    @property
    def worker(self):
        """The worker identity of this key's runs: `Run.worker` of the runs it claims."""
        return f"api:{self.name}"

    @property
    def is_operator(self):
        return self.scope == self.Scope.OPERATOR


class ApiRunCreator(models.Model):
    """Which API identity created a run, so its key may read it before anyone claims it."""

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="api_creator")
    worker = models.CharField(max_length=200)  # "api:<key name>"

    def __str__(self):
        return f"{self.run_id} created by {self.worker}"


class IdempotencyRecord(models.Model):
    """The first answer to a request carrying an `Idempotency-Key`, replayed to its retries.

    Keyed per API identity; `fingerprint` (method, path, body) tells a true retry from a
    reused key. Written in the same transaction as the change it answers for.
    """

    owner = models.CharField(max_length=200)  # "api:<key name>"
    key = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="idempotency_unique_key"),
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created")]

    def __str__(self):
        return f"{self.owner} {self.key} -> {self.status_code}"


class ApiTicket(models.Model):
    """A one-use, short-lived pass to one run's control socket, for clients that cannot
    send an Authorization header (browsers, Deno). Stored hashed, like keys."""

    key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="tickets")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    ticket_hash = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["expires_at"], name="ticket_expires")]

    def __str__(self):
        return f"ticket for {self.run_id} ({self.key_id})"


class ApiInflight(models.Model):
    """The streamed text of an API run's step in flight, so a viewer who joins mid-step
    catches up (an engine run's worker keeps its own). One row per run, bounded, removed
    when the step is committed or discarded or the run settles."""

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="+")
    step = models.PositiveIntegerField()
    text = models.TextField(blank=True)
    tools = models.JSONField(default=dict, blank=True)  # tool id -> latest state
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"in-flight step {self.step} of {self.run_id}"
