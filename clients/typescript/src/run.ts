// A run this key holds: checkpoints, batched deltas, tool calls, steps, answers, settling,
// and its background work (batch timer, heartbeats, control socket or long-poll).
import type {
  AnswerOut, ControlOut, DiscardIn, EventsOut, HeartbeatOut, RunOut, SettleIn, SettleOut, StepIn, TicketOut, ToolCallIn,
} from "./schema.js";
import type { Client } from "./client.js";
import {
  backoff, Cancelled, codePoints, endingOf, Failed, heard, type Heard, MAX_EVENTS, newCallId, pendingNote, RunwardenError,
} from "./errors.js";

/** An operator's answer to a waiting run (see docs/agent-api.md, "Operator answers"). */
export type Answer = AnswerOut;
type Event =
  | { type: "delta"; step: number; offset: number; text: string }
  | { type: "tool"; step: number; id: string; name: string; state: "started" | "finished" | "failed";
      args?: unknown; result?: unknown; error?: string };


export class Run {
  readonly id: string;
  readonly input: unknown;
  cancelled: Cancelled | null = null;
  settled: SettleOut | null = null;
  /** How the control channel reaches this run now: "socket" once the server said ready, else "long-poll". */
  controlVia: "socket" | "long-poll" | null = null;
  private readonly abort = new AbortController();
  private readonly done = new AbortController(); // the run's end: stops the background loops
  private delivered = false;
  private index: number;
  private text = "";
  private length = 0; // code points of `text`
  private toolCalls: ToolCallIn[] = [];
  private startedTools: string[] = [];
  private tokensIn = 0;
  private tokensOut = 0;
  private cost = 0;
  private estimated = false;
  private pending: Event[] = [];
  private pendingChars = 0;
  private lastContact = Date.now();
  private sending: Promise<unknown> = Promise.resolve();
  private answers: Answer[] = [];
  private seenAnswers = new Set<number>();
  private answerWaiter: (() => void) | null = null;
  private socket: WebSocket | null = null;
  private timer: ReturnType<typeof setInterval> | null = null;

  constructor(readonly client: Client, readonly data: RunOut) {
    this.id = data.id;
    this.input = data.input;
    this.index = data.totals.steps;
  }

  /** Aborted when a cancel is heard: hand it to fetch() and timers so they stop too. */
  get signal(): AbortSignal { return this.abort.signal; }

  checkpoint(): void {
    if (this.cancelled) {
      this.delivered = true;
      throw this.cancelled;
    }
  }

  stream(text: string): void {
    this.checkpoint();
    if (!text) return;
    const last = this.pending[this.pending.length - 1];
    if (last?.type === "delta" && last.step === this.index && last.offset + codePoints(last.text) === this.length) {
      last.text += text;
    } else {
      this.pending.push({ type: "delta", step: this.index, offset: this.length, text });
    }
    this.text += text;
    this.length += codePoints(text);
    this.pendingChars += text.length;
    if (this.pendingChars >= this.client.opts.maxChars) void this.flush().catch(() => {});
  }

  usage(tokensIn = 0, tokensOut = 0, cost = 0, estimated = false): void {
    this.tokensIn += tokensIn;
    this.tokensOut += tokensOut;
    this.cost += cost;
    this.estimated ||= estimated;
  }

  /** Resolves after `ms`, or throws Cancelled as soon as a cancel is heard. */
  sleep(ms: number): Promise<void> {
    this.checkpoint(); // before the timer, or a cancel heard already would leave it behind
    let timer: ReturnType<typeof setTimeout> | undefined;
    // The timer goes with a cancel: a pending one would keep the process alive after the run.
    return this.race(new Promise<void>((resolve) => { timer = setTimeout(resolve, ms); }))
      .finally(() => clearTimeout(timer));
  }

  /** Run `fn(args)` as tool call `name`, shown live; a cancel abandons it at once (Cancelled). */
  async callTool<T>(name: string, fn: (args: any, signal: AbortSignal) => T | Promise<T>,
                    args: Record<string, unknown> = {}): Promise<T | undefined> {
    this.checkpoint();
    const id = newCallId();
    this.startedTools.push(name);
    this.pending.push({ type: "tool", step: this.index, id, name, state: "started", args });
    let outcome: { result?: unknown; error?: string };
    try {
      outcome = { result: await this.race(Promise.resolve().then(() => fn(args, this.signal))) };
    } catch (error) {
      if (error instanceof Cancelled) throw error;
      outcome = { error: String(error).slice(0, 2000) };
    }
    this.checkpoint();
    this.toolCalls.push({ id, name, args, ...outcome } as ToolCallIn);
    this.pending.push({ type: "tool", step: this.index, id, name,
                        state: outcome.error === undefined ? "finished" : "failed", ...outcome });
    return outcome.result as T | undefined;
  }

  /** Commit the step in flight whole (its streamed text unless `text` is given); its index. */
  async step(text?: string, fields: Partial<Omit<StepIn, "index" | "text">> = {}): Promise<number> {
    this.checkpoint();
    return this.serial(async () => {
      await this.flushNow();
      const body: StepIn = {
        index: this.index, kind: fields.kind ?? (this.toolCalls.length ? "tool_calls" : "message"),
        text: text ?? this.text, tool_calls: this.toolCalls,
        tokens_in: this.tokensIn + (fields.tokens_in ?? 0), tokens_out: this.tokensOut + (fields.tokens_out ?? 0),
        cost: Math.round((this.cost + Number(fields.cost ?? 0)) * 1e6) / 1e6,
      };
      const [status, answer] = await this.client.request("POST", `/runs/${this.id}/steps`, body,
        { idempotencyKey: `${this.id}-step-${body.index}` });
      if (status === 409) this.conflict(answer);
      this.reset(body.index + 1);
      return body.index;
    });
  }

  /** Ask an operator to approve tool call `tool`: true when approved, false when denied. */
  async waitForApproval(tool: string, args: unknown = null, message = ""): Promise<boolean> {
    const answer = await this.wait("waiting_for_approval", { kind: "approval", tool, args, call_id: newCallId(), message });
    return answer.approved === true;
  }

  /** Ask an operator a question; the text of their answer. */
  async waitForInput(prompt: string): Promise<string> {
    return (await this.wait("waiting_for_input", { kind: "input", prompt })).text ?? "";
  }

  async settle(status: SettleIn["status"], reason: SettleIn["reason"], fields: Partial<SettleIn> = {}): Promise<SettleOut> {
    if (!this.settled) {
      const [, answer] = await this.client.request<SettleOut>("POST", `/runs/${this.id}/settle`,
        { ...fields, status, reason }, { idempotencyKey: `${this.id}-settle` });
      this.settled = answer;
    }
    return this.settled;
  }

  /** Start the background work: the batch timer, heartbeats, the control channel. */
  start(): this {
    const every = Math.min(this.client.opts.flushMs, this.client.opts.heartbeatMs);
    this.timer = setInterval(() => void this.tick(), every);
    void this.control();
    return this;
  }

  /** Settle as `within` does, from the error the body ended with (undefined: it returned): completed,
   * cancelled on Cancelled, the stop's ending on Stopped, failed otherwise. */
  async finish(error?: unknown): Promise<void> {
    try {
      if (error === undefined && this.delivered) error = this.cancelled;
      if (error === undefined) {
        try {
          if (this.text || this.toolCalls.length) await this.step();
          await this.settle("completed", "completed");
          return;
        } catch (late) {
          if (!(late instanceof Cancelled)) throw late;
          error = late;
        }
      }
      if (error instanceof Cancelled) { // a Stopped too: it settles as the stop says
        const [status, reason, truncated] = endingOf(error);
        await this.discard("cancelled");
        await this.settle(status, reason, truncated ? { truncated } : {});
        return;
      }
      const [reason, errorClass, message] = error instanceof Failed
        ? [error.reason, "Failed", error.message.slice(0, 2000)]
        : ["provider_failed", (error as Error)?.name ?? "Error", `the agent raised ${(error as Error)?.name ?? "an error"}`];
      await this.discard("failed");
      await this.settle("failed", reason as SettleIn["reason"], { error_class: errorClass, error_message: message });
    } finally {
      this.stopBackground();
    }
  }

  async within<T>(body: (run: Run) => Promise<T>): Promise<T | undefined> {
    this.start();
    let value: T;
    try {
      value = await body(this);
    } catch (error) {
      await this.finish(error);
      if (error instanceof Cancelled) return undefined;
      throw error;
    }
    await this.finish();
    return value;
  }

  // --- plumbing -----------------------------------------------------------------------

  /** Hear a cancel: see `heard` (errors.ts). */
  private stop(source: string, note: string, how: Heard = {}): void {
    const cancel = heard(this.cancelled, this.delivered, source, note, how);
    if (!cancel) return;
    this.cancelled = cancel; // first: aborting runs the listeners, which throw `this.cancelled`
    this.abort.abort(cancel); // a second time is a no-op
    this.answerWaiter?.();
  }

  private race<T>(work: Promise<T>): Promise<T> {
    this.checkpoint();
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => { this.delivered = true; reject(this.cancelled); };
      this.signal.addEventListener("abort", onAbort, { once: true });
      work.then(resolve, reject).finally(() => this.signal.removeEventListener("abort", onAbort));
    });
  }

  private conflict(answer: any): never {
    const code = answer?.error?.code ?? "conflict";
    if (code === "cancel_requested") this.stop("server", pendingNote(answer?.stop_reason), { stop: answer?.stop_reason });
    else if (["run_ended", "not_held", "not_claimed"].includes(code)) {
      this.stop("server", `the run is no longer ours (${code})`, { lost: true });
    } else throw new RunwardenError(409, code, answer?.error?.message ?? "", answer);
    this.checkpoint();
    throw this.cancelled;
  }

  private reset(index: number): void {
    this.index = index;
    this.text = "";
    this.length = 0;
    this.toolCalls = [];
    this.startedTools = [];
    this.tokensIn = this.tokensOut = this.cost = 0;
    this.estimated = false;
  }

  private serial<T>(work: () => Promise<T>): Promise<T> {
    const next = this.sending.then(work, work);
    this.sending = next.catch(() => {});
    return next;
  }

  private flush(): Promise<void> {
    return this.serial(() => this.flushNow());
  }

  private async flushNow(): Promise<void> {
    while (this.pending.length) {
      const batch = this.pending.splice(0, MAX_EVENTS);
      this.pendingChars = 0;
      const [status, answer] = await this.client.request<EventsOut>("POST", `/runs/${this.id}/events`, { events: batch });
      this.lastContact = Date.now();
      if (status === 409) this.conflict(answer);
      if (answer?.cancel_requested) this.stop("server", pendingNote(answer.stop_reason), { stop: answer.stop_reason });
    }
  }

  private async discard(reason: "cancelled" | "failed"): Promise<void> {
    this.pending = [];
    if (!(this.text || this.startedTools.length || this.tokensIn || this.tokensOut || this.cost)) return;
    const finished = new Set(this.toolCalls.map((call) => call.name));
    const abandoned = this.startedTools.filter((name) => !finished.has(name));
    const body: DiscardIn = {
      index: this.index, text: this.text, tool_calls: abandoned.length ? abandoned : this.startedTools,
      tokens_in: this.tokensIn, tokens_out: this.tokensOut, cost: Math.round(this.cost * 1e6) / 1e6,
      estimated: this.estimated, reason,
    };
    try {
      await this.client.request("POST", `/runs/${this.id}/discard`, body,
        { idempotencyKey: `${this.id}-discard-${body.index}` });
    } catch {
      // best effort: the settle still says how it ended
    }
  }

  private async wait(status: string, request: Record<string, unknown>): Promise<Answer> {
    this.checkpoint();
    await this.flush();
    const [code, answer] = await this.client.request("POST", `/runs/${this.id}/suspend`, { status, request });
    if (code === 409) this.conflict(answer);
    for (let asked = Date.now(); ; ) {
      this.checkpoint();
      const next = this.answers.shift();
      if (next) {
        await this.ack(next.id);
        return next;
      }
      if (Date.now() - asked >= this.client.opts.heartbeatMs) {
        // The slow path, as the heartbeat is for cancels: an answer whose push was lost is read here.
        asked = Date.now();
        const [status, listed] = await this.client.request<{ inputs: Answer[] }>("GET", `/runs/${this.id}/inputs`);
        if (status === 200) this.take(listed.inputs);
        continue;
      }
      await new Promise<void>((resolve) => {
        this.answerWaiter = resolve;
        setTimeout(resolve, 200);
      });
      this.answerWaiter = null;
    }
  }

  private async ack(id: number): Promise<void> {
    if (this.socket?.readyState === 1) this.socket.send(JSON.stringify({ type: "ack", id }));
    await this.client.request("POST", `/runs/${this.id}/inputs/${id}/ack`);
  }

  private take(answers: Answer[] | undefined): boolean {
    const fresh = (answers ?? []).filter((answer) => !this.seenAnswers.has(answer.id));
    for (const answer of fresh) {
      this.seenAnswers.add(answer.id);
      this.answers.push(answer);
    }
    if (fresh.length) this.answerWaiter?.();
    return fresh.length > 0;
  }

  private async tick(): Promise<void> {
    try {
      const old = Date.now() - this.lastContact;
      if (this.pending.length) await this.flush();
      else if (old >= this.client.opts.heartbeatMs) {
        const [, beat] = await this.client.request<HeartbeatOut>("POST", `/runs/${this.id}/heartbeat`);
        this.lastContact = Date.now();
        if (beat.cancel_requested) this.stop("server", pendingNote(beat.stop_reason), { stop: beat.stop_reason });
        else if (!beat.held) this.stop("server", `the run is no longer ours (${beat.status})`, { lost: true });
      }
    } catch {
      // retried already; the next tick tries again (a cancel found here is in `cancelled`)
    }
  }

  private stopBackground(): void {
    if (this.timer) clearInterval(this.timer);
    this.done.abort();
    this.socket?.close(1000);
  }

  private async control(): Promise<void> {
    for (let attempt = 0; !this.done.signal.aborted && !this.cancelled; ) {
      try {
        const socketWorked = this.client.opts.WebSocket ? await this.socketOnce() : false;
        if (!socketWorked) await this.pollOnce();
        attempt = 0;
      } catch {
        if (this.done.signal.aborted) return;
        await new Promise((resolve) => setTimeout(resolve, backoff(attempt++))); // a cut connection: again
      }
    }
  }

  private async pollOnce(): Promise<void> {
    const [status, body] = await this.client.request<ControlOut>("GET",
      `/runs/${this.id}/control?wait=${this.client.opts.pollS}`, undefined, { signal: this.done.signal });
    this.controlVia = "long-poll";
    if (status !== 200) return;
    if (body.cancel) this.stop(body.cancel.source, body.cancel.note, { stop: body.cancel.stop_reason });
    else if (!body.held) this.stop("server", `the run is no longer ours (${body.status})`, { lost: true });
    if (body.inputs?.length && !this.take(body.inputs)) await new Promise((resolve) => setTimeout(resolve, 100));
  }

  /** One control-socket connection, until it closes. False when the server has no tickets. */
  private async socketOnce(): Promise<boolean> {
    const [status, ticket] = await this.client.request<TicketOut>("POST", `/runs/${this.id}/ticket`)
      .catch((error) => { if (error instanceof RunwardenError && [404, 405].includes(error.status)) return [404, null] as const; throw error; });
    if (status !== 201 || !ticket) return false;
    if (this.done.signal.aborted) return true; // the run ended while the ticket was asked for
    const base = this.client.url.replace(/^http/, "ws").replace(/\/+$/, "");
    const Socket = this.client.opts.WebSocket!;
    await new Promise<void>((resolve, reject) => {
      const socket = new Socket(base + ticket.url);
      this.socket = socket;
      // However late the run ends (even before this socket opens), it closes the socket:
      // an open one would keep the process alive after the agent is done.
      const closeOnStop = () => socket.close(1000);
      this.done.signal.addEventListener("abort", closeOnStop, { once: true });
      let opened = false;
      socket.onopen = () => { opened = true; };
      socket.onmessage = (message) => {
        const frame = JSON.parse(String(message.data));
        if (frame.type === "ready") this.controlVia = "socket";
        else if (frame.type === "cancel") this.stop(frame.source, frame.note, { hard: frame.hard === true });
        else if (frame.type === "stop") this.stop(frame.source, frame.note, { stop: frame.reason });
        else if (frame.type === "input") this.take([frame.input]);
      };
      socket.onerror = () => { if (!opened) reject(new Error("control socket failed")); };
      socket.onclose = (event) => {
        this.socket = null;
        this.done.signal.removeEventListener("abort", closeOnStop);
        // 4403/4404: not (or no longer) this key's run. Anything else: reconnect, a new ticket.
        if ((event.code === 4403 || event.code === 4404) && !this.done.signal.aborted) {
          this.stop("server", `control socket refused (${event.code})`, { lost: true });
        }
        opened ? resolve() : reject(new Error(`control socket closed ${event.code}`));
      };
    });
    return true;
  }
}
