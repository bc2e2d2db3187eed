// What the client and the run share: errors, retry timing, code-point counting.
import type { SettleIn } from "./schema.js";

type SettleStatus = SettleIn["status"];
type SettleReason = SettleIn["reason"];

export const RETRY_STATUSES = new Set([502, 503, 504]);
export const MAX_EVENTS = 500;
export const backoff = (attempt: number) => Math.min(50 * 2 ** attempt, 2000);
export const codePoints = (text: string) => [...text].length; // the server counts offsets in code points
export const newCallId = () => `call_${Math.random().toString(16).slice(2, 14)}`;

/** An answer the client cannot act on (`status` 0: the server was not reached in time). */
export class RunwardenError extends Error {
  constructor(readonly status: number, readonly code: string, message: string, readonly body?: unknown) {
    super(`${status} ${code}: ${message}`);
    this.name = "RunwardenError";
  }
}

/** The run must stop: an operator or the watchdog (`hard`) cancelled it, or it is no longer ours (`lost`). */
export class Cancelled extends Error {
  constructor(readonly source = "", readonly note = "", readonly hard = false, readonly lost = false) {
    super(note || source || "cancelled");
    this.name = "Cancelled";
  }
}

/** A guardrail asked the run to stop: a budget it crossed (`reason` "budget_exhausted") or its
 * agent's loop policy ("policy_denied"). A kind of Cancelled, so code catching Cancelled stops for it
 * too; `withRun`/`finish` discard the step in flight and settle as `ending()` says: completed/
 * budget_exhausted, truncated (the money ran out, not an error), or failed/policy_denied — not cancelled. */
export class Stopped extends Cancelled {
  constructor(readonly reason: string, source = "", note = "", hard = false) {
    super(source, note || `stopped: ${reason}`, hard);
    this.name = "Stopped";
  }

  /** [status, reason, truncated]; an unknown reason (a newer server's) settles cancelled, which the
   * server records as the stop's own ending. */
  ending(): [SettleStatus, SettleReason, boolean] {
    if (this.reason === "budget_exhausted") return ["completed", "budget_exhausted", true];
    if (this.reason === "policy_denied") return ["failed", "policy_denied", false];
    return ["cancelled", "cancelled", false];
  }
}

/** How a run settles after `cancel`: [status, reason, truncated]. */
export const endingOf = (cancel: Cancelled): [SettleStatus, SettleReason, boolean] =>
  cancel instanceof Stopped ? cancel.ending() : ["cancelled", "cancelled", false];

export type Heard = { hard?: boolean; lost?: boolean; stop?: string | null };

/** The cancel a run holds after hearing one (`stop`: a guardrail's reason, making it a Stopped), or
 * null when nothing changes: one-shot, changed only to harden it, or to name the stop before the
 * agent met a bare cancel (`delivered`). The hard stop of an escalated stop is still that stop. */
export function heard(current: Cancelled | null, delivered: boolean, source: string, note: string,
                      how: Heard = {}): Cancelled | null {
  let { hard = false, lost = false, stop = null } = how;
  if (current) {
    stop ||= current instanceof Stopped ? current.reason : null;
    const news = (hard && !current.hard) || (!!stop && !(current instanceof Stopped) && !current.lost && !delivered);
    if (!news) return null;
    hard ||= current.hard;
    lost ||= current.lost;
  }
  return stop && !lost ? new Stopped(stop, source, note, hard) : new Cancelled(source, note, hard, lost);
}

/** The note of a cancel heard without one (a heartbeat's, a batch's or a 409's answer). */
export const pendingNote = (stop?: string | null) => stop ? `a guardrail's stop is pending (${stop})` : "a cancel is pending";

/** Throw it to end the run failed with `reason` and a message that is safe to show operators. */
export class Failed extends Error {
  constructor(message: string, readonly reason = "provider_failed") {
    super(message);
    this.name = "Failed";
  }
}
