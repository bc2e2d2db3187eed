// What the client and the run share: errors, retry timing, code-point counting.

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

/** Throw it to end the run failed with `reason` and a message that is safe to show operators. */
export class Failed extends Error {
  constructor(message: string, readonly reason = "provider_failed") {
    super(message);
    this.name = "Failed";
  }
}
