"""Create, claim and read runs."""

from django.db import transaction
from django.http import HttpResponse
from ninja import Query, Router, Status

from runs import agent_caps, transitions
from runs.api import reading
from runs.api.auth import require_agents, run_for
from runs.api.errors import ApiError, agent_capped
from runs.api.idempotency import IdempotencyKey, idempotent
from runs.api.schemas import ERRORS, ClaimIn, CreateRunIn, ErrorOut, RunOut, RunsOut, RunsQuery
from runs.api.serialize import run_out
from runs.models import ApiRunCreator, Run

router = Router(tags=["runs"])


def refuse_capped(agents):
    """429 `agent_budget_exhausted` when one of `agents` (all of them, for a claim of
    several) reached a 24 h cap."""
    capped = agent_caps.capped_agents()
    held = [agent for agent in agents if agent in capped]
    if held and len(held) == len(agents):
        raise agent_capped(held[0], capped[held[0]], agent_caps.retry_after(held[0]))


def mark_replay(request, response):
    if getattr(request, "idempotent_replay", False):
        response["Idempotent-Replayed"] = "true"


@router.post("/runs", response={201: RunOut, 429: ErrorOut, **ERRORS},
             summary="Create a run (optionally create and claim it)")
def create_run(request, payload: CreateRunIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
    """Queue a run; with `claim: true` it comes back running, held by this key.
    Honours `Idempotency-Key`: a retry returns the first answer and creates nothing.
    429 `agent_budget_exhausted` (with Retry-After when it can be told) when the agent
    reached a 24 h cap: nothing is created."""
    key = request.auth
    require_agents(key, [payload.agent])
    refuse_capped([payload.agent])

    def compute():
        # One transaction: nobody can claim the run between its creation and our claim.
        with transaction.atomic():
            try:
                run = transitions.create_run(
                    agent=payload.agent,
                    title=payload.title,
                    input=payload.input,
                    max_iterations=payload.max_iterations,
                    token_budget=payload.token_budget,
                    cost_budget=payload.cost_budget,
                    deadline=payload.deadline,
                    tool_call_budget=payload.tool_call_budget,
                )
            except ValueError as error:
                raise ApiError(422, str(error)) from None
            ApiRunCreator.objects.create(run=run, worker=key.worker)
            claimed = transitions.claim(run.pk, worker=key.worker) if payload.claim else None
            if claimed == transitions.ClaimOutcome.AGENT_CAPPED:  # capped since the check: roll the run back
                refuse_capped([payload.agent])
                raise ApiError(429, f"{payload.agent}: agent budget cap reached", code="agent_budget_exhausted")
            if payload.claim and not claimed:
                raise RuntimeError("a run created in this transaction could not be claimed")
            run = Run.objects.get(pk=run.pk)
        return 201, run_out(run)

    status, body = idempotent(request, key.worker, compute)
    mark_replay(request, response)
    return Status(status, body)


@router.post("/runs/claim", response={200: RunOut, 204: None, 429: ErrorOut, **ERRORS},
             summary="Claim the oldest queued run")
def claim_run(request, payload: ClaimIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
    """Take the oldest queued run of one of `agents` (200), or 204 when none is queued.
    Honours `Idempotency-Key`, so a retried claim does not take a second run.
    403 `agent_not_allowed` when one of `agents` is not this key's to run; 429
    `agent_budget_exhausted` when every one of `agents` reached a 24 h cap (runs of a
    capped agent among others are skipped)."""
    key = request.auth
    require_agents(key, payload.agents)
    refuse_capped(payload.agents)

    def compute():
        run = transitions.claim_next(worker=key.worker, agents=payload.agents)
        return (204, None) if run is None else (200, run_out(run))

    status, body = idempotent(request, key.worker, compute)
    mark_replay(request, response)
    return Status(status, body)


@router.get("/runs", response={200: RunsOut, **ERRORS}, summary="List runs")
def list_runs(request, query: Query[RunsQuery]):
    """Runs newest first, filtered by `status` (repeatable), `agent` and `since`, in
    keyset pages: pass `next_cursor` back as `cursor`. An agent key sees only the runs
    it created or claimed."""
    return Status(200, reading.list_runs(request.auth, query))


@router.get("/runs/{run_id}", response={200: RunOut, **ERRORS}, summary="Read a run")
def get_run(request, run_id: str):
    """A run this key created or holds (any run for an operator key)."""
    return Status(200, run_out(run_for(request.auth, run_id)))
