// The Client: one key on one server; requests with retries; create/claim/withRun.
import type { CreateRunIn, RunOut } from "./schema.js";
import { backoff, RETRY_STATUSES, RunwardenError } from "./errors.js";
import { Run } from "./run.js";

export interface ClientOptions {
  flushMs?: number;
  maxChars?: number;
  heartbeatMs?: number;
  pollS?: number;
  retryForMs?: number;
  fetch?: typeof fetch;
  /** A WebSocket constructor (e.g. from the `ws` package on Node 20); `null`: always long-poll. */
  WebSocket?: typeof WebSocket | null;
}


export class Client {
  readonly api: string;
  readonly opts: Required<Omit<ClientOptions, "WebSocket">> & { WebSocket: typeof WebSocket | null };

  constructor(readonly url: string, private readonly key: string, options: ClientOptions = {}) {
    this.api = `${url.replace(/\/+$/, "")}/api/v1`;
    const ws = options.WebSocket === undefined ? (globalThis as { WebSocket?: typeof WebSocket }).WebSocket ?? null
      : options.WebSocket;
    this.opts = {
      flushMs: 100, maxChars: 8000, heartbeatMs: 1000, pollS: 30, retryForMs: 30000,
      fetch: globalThis.fetch.bind(globalThis), ...options, WebSocket: ws,
    };
  }

  /** [status, JSON body]. Answers other than 2xx/409 throw RunwardenError; network errors and
   * 502/503/504 are retried for retryForMs (with the same Idempotency-Key). */
  async request<T = any>(method: string, path: string, body?: unknown,
                         init: { idempotencyKey?: string; signal?: AbortSignal } = {}): Promise<[number, T]> {
    const headers: Record<string, string> = { Authorization: `Bearer ${this.key}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (init.idempotencyKey) headers["Idempotency-Key"] = init.idempotencyKey;
    const deadline = Date.now() + this.opts.retryForMs;
    for (let attempt = 0; ; attempt++) {
      let failure: RunwardenError;
      try {
        const response = await this.opts.fetch(this.api + path, {
          method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: init.signal,
        });
        const text = await response.text();
        let payload: any = null;
        try {
          payload = text ? JSON.parse(text) : null;
        } catch {
          // not JSON (a proxy's error page): judged by its status below, never retried as a network error
          payload = { error: { code: "not_json", message: text.slice(0, 200) } };
        }
        if (response.ok || response.status === 409) return [response.status, payload as T];
        const error = payload?.error ?? {};
        failure = new RunwardenError(response.status, error.code ?? "error", error.message ?? "", payload);
        if (!RETRY_STATUSES.has(response.status)) throw failure;
      } catch (error) {
        if (error instanceof RunwardenError) throw error;
        if (init.signal?.aborted) throw error;
        failure = new RunwardenError(0, "unreachable", String(error));
      }
      if (Date.now() + backoff(attempt) > deadline) throw failure;
      await new Promise((resolve) => setTimeout(resolve, backoff(attempt)));
    }
  }

  /** Create a run of `agent` and claim it. Call `run.start()` then `run.finish()`, or use `withRun`. */
  async run(agent: string, fields: Omit<CreateRunIn, "agent" | "claim"> = {}): Promise<Run> {
    const [, data] = await this.request<RunOut>("POST", "/runs", { ...fields, agent, claim: true },
      { idempotencyKey: `create-${crypto.randomUUID()}` });
    return new Run(this, data);
  }

  /** The oldest queued run of one of `agents`, claimed, or null. */
  async claim(agents: string[]): Promise<Run | null> {
    const [status, data] = await this.request<RunOut>("POST", "/runs/claim", { agents },
      { idempotencyKey: `claim-${crypto.randomUUID()}` });
    return status === 204 ? null : new Run(this, data);
  }

  /** Create and claim a run, run `body` in it, and settle: completed when it resolves,
   * cancelled when it throws Cancelled (resolves undefined), as the stop says when it throws Stopped
   * (completed/budget_exhausted truncated or failed/policy_denied; resolves undefined), failed (safe
   * message) otherwise (rethrown). */
  async withRun<T>(agent: string, fields: Omit<CreateRunIn, "agent" | "claim">,
                   body: (run: Run) => Promise<T>): Promise<T | undefined> {
    const run = await this.run(agent, fields);
    return run.within(body);
  }
}
