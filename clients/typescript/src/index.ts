// Runwarden's official TypeScript client: report an agent's run live, obey the Abort button.
// No runtime dependencies: fetch, AbortController and (when there is one) WebSocket.
//
//   const client = new Client(url, key);
//   await client.withRun("my-agent", { title: "t" }, async (run) => {
//     run.stream("Hello");          // batched, sent within flushMs
//     await run.step();             // commit the step in flight
//   });                             // settled completed / cancelled / failed
//
// Control channel: the WebSocket when one is available (browsers, Deno, Node 22+, or a
// constructor given as `WebSocket`), authenticated with a one-use ticket (never the key in
// a URL); else the long-poll. A heartbeat's, an events batch's or a step's answer carries
// a cancel too. A cancel sets `run.cancelled` and aborts `run.signal`; `checkpoint()`,
// `stream()`, `step()`, `callTool()` and `sleep()` then throw `Cancelled` — or `Stopped` (a
// Cancelled with a `reason`) when a guardrail asked the stop: the run then settles
// completed/budget_exhausted (truncated) or failed/policy_denied, as the stop says.
export type * from "./schema.js";
export { Cancelled, Failed, RunwardenError, Stopped } from "./errors.js";
export { Client, type ClientOptions } from "./client.js";
export { Run, type Answer } from "./run.js";
