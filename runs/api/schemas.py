"""Request and response bodies. Field names are the transitions' argument names.

Bounds mirror the database columns (a PositiveIntegerField holds < 2**31, a
DecimalField(14, 6) < 10**8), so an out-of-range number is a 422 here rather than a
database error later. Unknown fields are refused (422), so a misspelt limit is not
silently ignored.
"""

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AwareDatetime, ConfigDict, Field, StrictBool, field_validator, model_validator

from runs import rules
from runs.models import Run

INT32 = 2**31 - 1
INT63 = 2**63 - 1
# strict: JSON true is not the number 1, nor "5" the number 5.
Count = Annotated[int, Field(ge=0, le=INT32, strict=True)]
BigCount = Annotated[int, Field(ge=0, le=INT63, strict=True)]
Money = Annotated[Decimal, Field(ge=0, le=Decimal(99999999), max_digits=14, decimal_places=6)]
Name = Annotated[str, Field(min_length=1, max_length=100)]
Status = Literal[tuple(Run.Status.values)]
Reason = Literal[tuple(Run.TerminationReason.values)]


class Strict(Schema):
    model_config = ConfigDict(extra="forbid")


class CreateRunIn(Strict):
    agent: Name
    title: str = Field("", max_length=300)
    input: dict[str, Any] = Field(default_factory=dict, description="free-form JSON object given to the agent")
    max_iterations: Annotated[int, Field(ge=1, le=INT32, strict=True)] | None = None
    token_budget: Annotated[int, Field(ge=1, le=INT63, strict=True)] | None = None
    cost_budget: Annotated[Decimal, Field(gt=0, le=Decimal(99999999), max_digits=14, decimal_places=6)] | None = None
    deadline: AwareDatetime | None = Field(None, description="ISO 8601 with a UTC offset")
    tool_call_budget: Annotated[int, Field(ge=1, le=INT32, strict=True)] | None = None
    claim: StrictBool = Field(False, description="create and claim in one step: the run comes back running, held by this key")

    @field_validator("deadline")
    @classmethod
    def _bounded(cls, value):
        # Outside these years a UTC conversion overflows datetime: refuse, don't crash.
        if value is not None and not 1970 <= value.year <= 9000:
            raise ValueError("deadline must be between the years 1970 and 9000")
        return value.astimezone(UTC) if value is not None else None


class ClaimIn(Strict):
    agents: list[Name] = Field(min_length=1, max_length=100, description="agent names this worker runs")


class CancelInfo(Schema):
    requested_at: datetime
    by: str
    source: str
    note: str
    stop_reason: Literal["budget_exhausted", "policy_denied"] | None = Field(
        None, description="set when a guardrail, not an operator, asks the run to stop: settle completed/"
        "budget_exhausted (truncated) or failed/policy_denied (settling cancelled is recorded so too)")


class Totals(Schema):
    tokens_in: int
    tokens_out: int
    cost: float
    steps: int
    tool_calls: int


class RunOut(Schema):
    id: str
    agent: str
    title: str
    input: Any
    status: Status
    termination_reason: str
    truncated: bool
    worker: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    cancel: CancelInfo | None
    max_iterations: int | None
    token_budget: int | None
    cost_budget: float | None
    deadline: datetime | None
    tool_call_budget: int | None
    totals: Totals
    error_class: str
    error_message: str
    retry_of: str | None


class BudgetsIn(Strict):
    """A limit left out stays as it is; null clears it. At least one is required."""

    token_budget: Annotated[int, Field(ge=1, le=INT63, strict=True)] | None = None
    cost_budget: Annotated[Decimal, Field(gt=0, le=Decimal(99999999), max_digits=14, decimal_places=6)] | None = None
    tool_call_budget: Annotated[int, Field(ge=1, le=INT32, strict=True)] | None = None
    deadline: AwareDatetime | None = Field(None, description="ISO 8601 with a UTC offset, in the future")

    _bounded = field_validator("deadline")(CreateRunIn._bounded.__func__)

    @model_validator(mode="after")
    def _something(self):
        if not self.model_fields_set:
            raise ValueError("give at least one of token_budget, cost_budget, tool_call_budget, deadline")
        return self


class HeartbeatOut(Schema):
    held: bool = Field(description="false: stop working on this run (it ended, or is not yours)")
    cancel_requested: bool = Field(description="true: stop at your next checkpoint and settle cancelled")
    stop_reason: str | None = Field(None, description="set with cancel_requested when a guardrail asks the stop "
                                    "(budget_exhausted, policy_denied): settle with that reason")
    status: str


class DeltaEvent(Strict):
    type: Literal["delta"]
    step: Count
    offset: BigCount = Field(description="where `text` starts in the step's streamed text, in Unicode code points "
                                         "(not UTF-16 units)")
    text: str


class ToolEvent(Strict):
    type: Literal["tool"]
    step: Count
    id: str = Field(min_length=1, max_length=200)
    name: str = Field("", max_length=200)
    state: Literal["started", "finished", "failed"]
    args: Any = None
    result: Any = None
    error: str | None = None


Event = Annotated[DeltaEvent | ToolEvent, Field(discriminator="type")]


class EventsIn(Strict):
    events: list[Event] = Field(description="at most 500 items and 1 MiB per request (413 beyond)")


class EventsOut(Schema):
    accepted: int
    relayed: int = Field(description="messages sent to live viewers after coalescing")
    cancel_requested: bool
    stop_reason: str | None = Field(None, description="set with cancel_requested when a guardrail asks the stop "
                                    "(budget_exhausted, policy_denied): settle with that reason")


class ToolCallIn(Strict):
    id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    args: Any = None
    result: Any = None
    error: str | None = None

    @model_validator(mode="after")
    def _finished(self):
        # History never holds a tool call without its result.
        if "result" not in self.model_fields_set and "error" not in self.model_fields_set:
            raise ValueError("a committed tool call needs its result or its error")
        return self


class StepIn(Strict):
    index: Count = Field(description="0 for the first step; must equal the run's committed step count")
    kind: Literal["message", "tool_calls"]
    text: str = ""
    tool_calls: list[ToolCallIn] = Field(default_factory=list, max_length=500,
                                         description="each `id` once per step (422 `duplicate_tool_call_id`)")
    tokens_in: Count = 0
    tokens_out: Count = 0
    cost: Money = Decimal(0)

    def duplicate_call_id(self):
        """The first tool-call id given twice, or None (checked in the view for its code)."""
        seen = set()
        for call in self.tool_calls:
            if call.id in seen:
                return call.id
            seen.add(call.id)
        return None


class DiscardIn(Strict):
    index: Count = Field(description="the step that was in flight (the run's committed step count)")
    text: str = Field("", description="what had streamed of it, kept on the timeline as interrupted text")
    tool_calls: list[str] = Field(default_factory=list, max_length=500,
                                  description="names of the tool calls abandoned (never their half-done results)")
    tokens_in: Count = 0
    tokens_out: Count = 0
    cost: Money = Decimal(0)
    estimated: StrictBool = Field(False, description="true when the spend is your estimate (no usage came)")
    reason: Literal["cancelled", "failed"] = "cancelled"


class DiscardOut(Schema):
    discarded: bool
    index: int


class StepOut(Schema):
    committed: bool
    index: int


class TotalsIn(Strict):
    tokens_in: BigCount | None = None
    tokens_out: BigCount | None = None
    cost: Money | None = None
    steps: Count | None = None
    tool_calls: Count | None = None


class SettleIn(Strict):
    status: Literal["completed", "failed", "cancelled"]
    reason: Reason
    truncated: StrictBool = False
    totals: TotalsIn | None = Field(None, description="checked against the record: 422 `totals_mismatch` when "
                                    "steps/tool_calls differ from the committed ones or spend is below the recorded")
    error_class: str = Field("", max_length=200)
    error_message: str = Field("", max_length=20000)


class Outcome(Schema):
    """Where a run stands after a guarded change (won or lost)."""

    status: str
    reason: str


class SettleOut(Outcome):
    settled: bool


class SuspendIn(Strict):
    status: Literal["waiting_for_input", "waiting_for_approval"]
    request: dict[str, Any] | None = Field(None, description="what the run waits for, shown to the operator")


class SuspendOut(Outcome):
    suspended: bool


class CancelIn(Strict):
    note: str = Field("", max_length=rules.NOTE_LIMIT)


class CancelOut(Outcome):
    outcome: Literal["requested", "already_requested", "settled", "already_terminal"]


class RetireOut(Outcome):
    retired: bool


class AnswerOut(Schema):
    id: int
    kind: Literal["approval", "message"]
    approved: bool | None = Field(description="approval: the decision; null for a message")
    note: str = Field(description="the operator's note with an approval or denial ('' when none)")
    text: str = Field(description="a message's text ('' for an approval)")
    request: dict[str, Any] = Field(description="the suspend `request` this answers")
    by: str
    created_at: datetime


class AnswersOut(Schema):
    inputs: list[AnswerOut]


class AckOut(Schema):
    id: int
    acked: bool
    first: bool = Field(description="false when it had been acknowledged before")


class TicketOut(Schema):
    ticket: str
    expires_at: datetime
    url: str = Field(description="the control socket's path with the ticket")


class ControlOut(Schema):
    cancel: CancelInfo | None = Field(description="set once a cancel is pending: stop and settle cancelled")
    status: str
    held: bool
    inputs: list[AnswerOut] = Field(description="operator answers not yet acknowledged, oldest first")


class RunsQuery(Schema):
    status: list[Status] = Field(default_factory=list, description="repeatable")
    agent: Name | None = None
    since: AwareDatetime | None = Field(None, description="created at or after (ISO 8601 with an offset)")
    limit: Annotated[int, Field(ge=1, le=200)] = 50
    cursor: str | None = Field(None, max_length=200, description="`next_cursor` of the previous page")


class RunsOut(Schema):
    runs: list[RunOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


class StepsQuery(Schema):
    start: Annotated[int, Field(ge=0, le=INT32)] = 0
    limit: Annotated[int, Field(ge=1, le=500)] = 100


class ToolCallOut(Schema):
    id: str = ""
    name: str = ""
    args: Any = None
    result: Any = None
    error: str | None = None


class StepRecord(Schema):
    index: int
    kind: str
    text: str
    tool_calls: list[ToolCallOut]
    tokens_in: int
    tokens_out: int
    cost: float
    committed_at: datetime


class StepsOut(Schema):
    steps: list[StepRecord]
    next_start: int | None = Field(description="the next index to ask for; null when there is none yet")


class EventsQuery(Schema):
    after: Annotated[int, Field(ge=0, le=INT32)] = 0
    limit: Annotated[int, Field(ge=1, le=500)] = 100


class EventRecord(Schema):
    seq: int
    kind: str
    at: datetime
    actor: str
    source: str
    data: dict[str, Any]


class EventsPageOut(Schema):
    events: list[EventRecord]
    next_after: int | None = Field(description="the last seq returned; null when none")


class ErrorDetail(Schema):
    code: str
    message: str
    fields: dict[str, str]


class ErrorOut(Schema):
    error: ErrorDetail


class ConflictOut(ErrorOut):
    """A 409: the change lost; `status`/`reason` say what stands."""

    status: str = ""
    reason: str = ""
    settled: bool | None = None
    stop_reason: str | None = Field(None, description="with code `cancel_requested`, when a guardrail asks the stop "
                                    "(budget_exhausted, policy_denied): settle with that reason")


# The error answers every operation documents (413: a body over 1 MiB).
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 405: ErrorOut, 413: ErrorOut, 422: ErrorOut}
