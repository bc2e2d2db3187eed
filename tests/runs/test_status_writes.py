"""Only `runs/transitions/` writes a run's status, reason or end time.

A static check over the source (ast, not grep: comments and reads do not count):
every .py file outside `runs/transitions/`, migrations and tests is read, and any
write of `status`, `termination_reason` or `finished_at` fails the suite, naming the
file and line. A write is a keyword to `.update()` / `.create()` / `Run(...)` and
friends, an attribute assignment (then `.save()`), `setattr`, `save(update_fields=…)`,
or raw SQL that UPDATEs or INSERTs one of them.
"""

import ast
import re
from pathlib import Path

from django.conf import settings

FIELDS = {"status", "termination_reason", "finished_at"}
WRITERS = {"update", "create", "get_or_create", "update_or_create", "bulk_create", "bulk_update", "Run"}
SQL = re.compile(
    r"\bUPDATE\s+\S+\s+SET\b[^;]*\b(status|termination_reason|finished_at)\s*="
    r"|\bINSERT\s+INTO\s+\S+\s*\([^)]*\b(status|termination_reason|finished_at)\b",
    re.I | re.S,
)
ROOT = Path(settings.BASE_DIR)
SKIPPED = ("runs/transitions/", "/migrations/", "tests/", ".venv/", "node_modules/")
# file -> why its writes are not status changes. Keep this short.
ALLOWED = {
    "dashboard/management/commands/bench_list.py": "bulk-loads synthetic rows for the list benchmark "
                                                   "(INSERT … SELECT), changes no existing run",
    "runs/alerts/delivery.py": "an alert delivery's own status (pending/sent/failed), never a run's",
}


def sources():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(".") or any(rel.startswith(part) or f"/{part}" in f"/{rel}" for part in SKIPPED):
            continue
        yield rel, path.read_text()


def _name(func):
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _strings(node):
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _own_attributes(tree):
    """`self.<field>` inside an `__init__`: an object setting up its own attribute (an
    exception's `status`), not a row being changed."""
    return {
        id(node)
        for func in ast.walk(tree) if isinstance(func, ast.FunctionDef) and func.name == "__init__"
        for node in ast.walk(func) if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "self"
    }


def _docstrings(tree):
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }


def writes(tree):
    """(line, what) for every write of a guarded field in `tree`."""
    found = []
    own, docs = _own_attributes(tree), _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            keywords = {k.arg for k in node.keywords} & FIELDS
            if name in WRITERS and keywords:
                found.append((node.lineno, f"{name}({', '.join(sorted(keywords))}=…)"))
            if name == "setattr" and len(node.args) > 1 and _strings(node.args[1]) & FIELDS:
                found.append((node.lineno, "setattr"))
            fields = [k for k in node.keywords if k.arg == "update_fields"]
            if name == "save" and fields and _strings(fields[0].value) & FIELDS:
                found.append((node.lineno, "save(update_fields=…)"))
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (isinstance(part, ast.Attribute) and part.attr in FIELDS and isinstance(part.ctx, ast.Store)
                        and id(part) not in own):
                    found.append((node.lineno, f".{part.attr} = …"))
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                and SQL.search(node.value)):
            found.append((node.lineno, "raw SQL"))
    return found


def offences():
    return [f"{rel}:{line}: {what}" for rel, text in sources() if rel not in ALLOWED
            for line, what in writes(ast.parse(text, rel))]


def test_nothing_outside_the_transitions_writes_status_reason_or_finished_at():
    checked = [rel for rel, _ in sources()]
    assert "runs/models.py" in checked and "dashboard/views/actions.py" in checked
    assert not any(rel.startswith(("runs/transitions/", "tests/")) for rel in checked)
    assert offences() == []


WRITES = {
    "Run.objects.filter(pk=1).update(status='failed')": "update(status=…)",
    "Run.objects.create(agent='a', termination_reason='x')": "create(termination_reason=…)",
    "Run(agent='a', finished_at=now)": "Run(finished_at=…)",
    "run.status = 'failed'\nrun.save()": ".status = …",
    "run.finished_at: object = now": ".finished_at = …",
    "setattr(run, 'termination_reason', 'x')": "setattr",
    "run.save(update_fields=['status'])": "save(update_fields=…)",
    "cursor.execute('UPDATE runs_run SET status = %s')": "raw SQL",
    "sql = 'INSERT INTO runs_run (id, finished_at) VALUES (%s, %s)'": "raw SQL",
    "class Run:\n    def finish(self):\n        self.status = 'failed'": ".status = …",
}
READS = (
    "Run.objects.filter(status='running').values('status', 'finished_at')\n"
    "x = run.status\n"
    "f(status=1)\n"
    "class ApiError(Exception):\n    def __init__(self, status):\n        self.status = status\n"
    "def f():\n    'Runs SET their status = cancelled through the transitions: UPDATE runs_run SET status = x.'\n"
)


def test_the_check_sees_each_kind_of_write():
    # The check itself must be able to fail: one snippet per kind of write it knows.
    for code, what in WRITES.items():
        assert [w for _, w in writes(ast.parse(code))] == [what], code


def test_the_check_ignores_reads_docstrings_and_an_objects_own_attributes():
    assert writes(ast.parse(READS)) == []
