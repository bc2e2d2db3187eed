"""`manage.py alerts …` — alert rules and their webhooks (docs/alerts.md).

`alerts add` writes a rule (a wrong value: one line, exit 2, nothing written; with no
--secret one is generated and printed once), `alerts list` shows the rules with their
deliveries, `alerts test NAME` sends one signed test delivery now (exit 1 if it is not
answered 2xx), `alerts remove NAME` deletes a rule and its delivery log.
"""

import secrets

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Max, Q

from runs.alert_records import AlertDelivery, AlertFormat, AlertOn, AlertRule
from runs.alerts import delivery

D = AlertDelivery.Status


def one_line(error):
    """The first message of a ValidationError, naming its field."""
    fields = getattr(error, "message_dict", None)
    if fields:
        field, messages = next(iter(fields.items()))
        return f"{field.replace('_', '-')}: {messages[0]}" if field != "__all__" else messages[0]
    return error.messages[0]


class Command(BaseCommand):
    help = "Alert rules and signed webhooks: add, list, test, remove."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="a rule: on EVENT (for AGENT), POST to URL signed with SECRET")
        add.add_argument("name", help="a slug: letters, digits, - and _")
        add.add_argument("--on", required=True, choices=AlertOn.values)
        add.add_argument("--agent", default="", help="only runs of this agent (default: any)")
        add.add_argument("--url", required=True, help="the webhook, http:// or https://")
        add.add_argument("--secret", default=None, help="signs each delivery (default: generated, printed once)")
        add.add_argument("--format", default=AlertFormat.JSON, choices=AlertFormat.values)
        add.add_argument("--threshold-s", type=int, default=None, dest="threshold_s",
                         help="waiting_too_long: seconds waiting for approval")
        add.add_argument("--rate-pct", type=int, default=None, dest="rate_pct",
                         help="failure_rate: failed share of ended runs, in percent")
        add.add_argument("--window-s", type=int, default=None, dest="window_s", help="failure_rate: the window")
        add.add_argument("--min-runs", type=int, default=None, dest="min_runs",
                         help="failure_rate: fewer ended runs in the window never alert (default 5)")
        sub.add_parser("list", help="the rules, with their deliveries")
        test = sub.add_parser("test", help="send one test delivery now; exit 1 unless answered 2xx")
        test.add_argument("name")
        remove = sub.add_parser("remove", help="delete a rule and its delivery log")
        remove.add_argument("name")

    def handle(self, *args, action, **options):
        getattr(self, f"do_{action}")(**options)

    def _rule(self, name):
        try:
            return AlertRule.objects.get(name=name)
        except AlertRule.DoesNotExist:
            raise CommandError(f"no alert rule named {name!r} (see `alerts list`)", returncode=2) from None

    def do_add(self, *, name, on, agent, url, secret, format, threshold_s, rate_pct, window_s, min_runs, **_):
        generated = secret is None
        if secret == "":
            raise CommandError("secret: may not be empty (leave --secret out to have one generated)", returncode=2)
        if threshold_s is not None and on != AlertOn.WAITING_TOO_LONG:
            raise CommandError("--threshold-s is only for --on waiting_too_long", returncode=2)
        if (rate_pct, window_s, min_runs) != (None, None, None) and on != AlertOn.FAILURE_RATE:
            raise CommandError("--rate-pct, --window-s and --min-runs are only for --on failure_rate", returncode=2)
        rule = AlertRule(
            name=name, on=on, agent=agent.strip(), url=url.strip(), secret=secret or secrets.token_urlsafe(32),
            format=format, threshold_s=threshold_s, failure_rate_pct=rate_pct, window_s=window_s,
        )
        if min_runs is not None:
            rule.min_runs = min_runs
        try:
            rule.full_clean()
        except ValidationError as error:
            raise CommandError(one_line(error), returncode=2) from None
        rule.save()
        self.stdout.write(f"alert rule {rule.name}: on {rule.on}"
                          f"{f' for agent {rule.agent}' if rule.agent else ''} -> {rule.url} ({rule.format})")
        if generated:
            self.stdout.write(f"secret (shown once, keep it for your receiver): {rule.secret}")

    def do_list(self, **_):
        rules = AlertRule.objects.annotate(
            sent=Count("deliveries", filter=Q(deliveries__status=D.SENT)),
            pending=Count("deliveries", filter=Q(deliveries__status=D.PENDING)),
            failed=Count("deliveries", filter=Q(deliveries__status=D.FAILED)),
            last_at=Max("deliveries__created_at"),
        )
        if not rules:
            self.stdout.write("no alert rules (add one: manage.py alerts add --on EVENT --url URL NAME)")
            return
        self.stdout.write(f"{'name':<24} {'on':<20} {'agent':<16} {'format':<6} {'on?':<4} "
                          f"{'sent':>5} {'pend':>5} {'fail':>5}  last delivery")
        for rule in rules:
            last = rule.deliveries.order_by("-created_at", "-id").first()
            latest = (f"{last.status} {last.created_at:%Y-%m-%d %H:%M:%S}"
                      f"{f' ({last.last_error[:60]})' if last.last_error else ''}") if last else "-"
            self.stdout.write(
                f"{rule.name:<24} {rule.on:<20} {rule.agent or '*':<16} {rule.format:<6} "
                f"{'yes' if rule.enabled else 'no':<4} {rule.sent:>5} {rule.pending:>5} {rule.failed:>5}  {latest}"
            )
            self.stdout.write(f"{'':<24} -> {rule.url}")

    def do_test(self, *, name, **_):
        rule = self._rule(name)
        result, code, error = delivery.send_test(rule)
        if result == delivery.Result.SENT:
            self.stdout.write(f"sent: {rule.url} answered {code}")
            return
        raise CommandError(f"not delivered to {rule.url}: {error}", returncode=1)

    def do_remove(self, *, name, **_):
        rule = self._rule(name)
        deliveries = rule.deliveries.count()
        rule.delete()
        self.stdout.write(f"removed alert rule {name} and its {deliveries} deliveries")
