// The TypeScript client against a real Runwarden server (started by
// tests/clients/test_typescript.py, which passes RUNWARDEN_URL, RUNWARDEN_KEY and
// RUNWARDEN_OPERATOR_KEY). Run with `node --test test/` after `npm run build`.
import assert from "node:assert/strict";
import net from "node:net";
import { test } from "node:test";

import { Cancelled, Client, Failed, Stopped } from "../dist/index.js";

const URL = process.env.RUNWARDEN_URL;
const KEY = process.env.RUNWARDEN_KEY;
const OPS = new Client(URL, process.env.RUNWARDEN_OPERATOR_KEY);
const options = { flushMs: 20, heartbeatMs: 500, WebSocket: globalThis.WebSocket ?? null };

const read = async (id) => (await OPS.request("GET", `/runs/${id}`))[1];
const abort = async (id) => {
  const [status, body] = await OPS.request("POST", `/runs/${id}/cancel`, { note: "ts test" });
  assert.equal(status, 200);
  assert.equal(body.outcome, "requested");
};
const SOCKET = process.env.RUNWARDEN_EXPECT_SOCKET === "1"; // run with --experimental-websocket
const viaExpected = SOCKET ? "socket" : "long-poll";
const discards = async (id) => {
  const [status, body] = await OPS.request("GET", `/runs/${id}/events?limit=500`).catch(() => [404, null]);
  return status === 200 ? body.events.filter((e) => e.kind === "step_discarded").map((e) => e.data) : null;
};
const until = async (check) => { while (!(await check())) await new Promise((r) => setTimeout(r, 10)); };

test("a run streams, commits and settles completed", async () => {
  const client = new Client(URL, KEY, options);
  let id;
  const value = await client.withRun("ts-agent", { title: "ts" }, async (run) => {
    id = run.id;
    run.stream("Héllo 😀");
    run.stream(" world"); // offsets in code points: the second delta continues the first
    run.usage(5, 2);
    assert.equal(await run.step(), 0);
    assert.equal(await run.callTool("add", ({ a, b }) => a + b, { a: 2, b: 3 }), 5);
    await run.step("added");
    return "done";
  });
  assert.equal(value, "done");
  const row = await read(id);
  assert.deepEqual([row.status, row.termination_reason, row.totals.steps, row.totals.tokens_in], ["completed", "completed", 2, 5]);
});

test("abort mid-stream discards the step and settles cancelled", async () => {
  const client = new Client(URL, KEY, options);
  let id, streamed = false, runRef = {};
  const body = client.withRun("ts-agent", {}, async (run) => {
    id = run.id;
    runRef = run;
    run.stream("first ");
    await run.step();
    for (;;) {
      run.stream("w ");
      streamed = true;
      await run.sleep(10);
    }
  });
  await until(() => streamed && runRef.controlVia === viaExpected);
  await abort(id);
  assert.equal(await body, undefined);
  const row = await read(id);
  assert.deepEqual([row.status, row.termination_reason, row.totals.steps], ["cancelled", "cancelled", 1]);
  const traces = await discards(id);
  if (traces) assert.ok(traces[0].text.startsWith("w ") && traces[0].index === 1);
});

test("abort mid-tool abandons the call", async () => {
  const client = new Client(URL, KEY, options);
  let id, inTool = false, finished = false;
  const body = client.withRun("ts-agent", {}, async (run) => {
    id = run.id;
    await run.callTool("crawl", async () => {
      inTool = true;
      await new Promise((r) => setTimeout(r, 60_000).unref());
      finished = true;
    });
    await run.step("never");
  });
  await until(() => inTool);
  await abort(id);
  await body;
  assert.equal(finished, false);
  const row = await read(id);
  assert.deepEqual([row.status, row.termination_reason, row.totals.steps], ["cancelled", "cancelled", 0]);
  const traces = await discards(id);
  if (traces) assert.deepEqual(traces[0].tool_calls, ["crawl"]);
});

test("an error fails the run with a safe message; Failed names its reason", async () => {
  const client = new Client(URL, KEY, options);
  let id;
  await assert.rejects(client.withRun("ts-agent", {}, async (run) => {
    id = run.id;
    throw new TypeError("sk-secret");
  }), TypeError);
  let row = await read(id);
  assert.deepEqual([row.status, row.termination_reason, row.error_class], ["failed", "provider_failed", "TypeError"]);
  assert.ok(!row.error_message.includes("sk-secret"));
  await assert.rejects(client.withRun("ts-agent", {}, async (run) => {
    id = run.id;
    throw new Failed("not allowed here", "policy_denied");
  }), Failed);
  row = await read(id);
  assert.deepEqual([row.termination_reason, row.error_message], ["policy_denied", "not allowed here"]);
});

test("a cut connection is retried and the abort still lands", async () => {
  const target = new globalThis.URL(URL);
  const sockets = new Set();
  let up = true;
  const proxy = net.createServer((inbound) => {
    if (!up) return inbound.resetAndDestroy();
    const outbound = net.connect(Number(target.port), target.hostname);
    sockets.add(inbound).add(outbound);
    inbound.pipe(outbound).pipe(inbound);
    const drop = () => { inbound.destroy(); outbound.destroy(); sockets.delete(inbound); sockets.delete(outbound); };
    inbound.on("error", drop).on("close", drop);
    outbound.on("error", drop).on("close", drop);
  });
  await new Promise((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  const client = new Client(`http://127.0.0.1:${proxy.address().port}`, KEY, options);
  let id, streamed = 0;
  const body = client.withRun("ts-agent", {}, async (run) => {
    id = run.id;
    run.stream("before ");
    await run.step();
    for (;;) {
      run.stream("w ");
      streamed++;
      await run.sleep(10);
    }
  });
  await until(() => streamed > 0);
  up = false;
  for (const socket of sockets) socket.resetAndDestroy(); // every connection reset
  up = true;
  const before = streamed;
  await until(() => streamed > before + 5);
  await abort(id);
  await body;
  proxy.close();
  for (const socket of sockets) socket.destroy();
  const row = await read(id);
  assert.deepEqual([row.status, row.termination_reason, row.totals.steps], ["cancelled", "cancelled", 1]);
});


test("an approval is answered: approved goes on, denied does not run the tool", async () => {
  // tests/clients/test_typescript.py's operator approves paths under /tmp and denies the rest.
  const client = new Client(URL, KEY, options);
  const ran = [];
  let id;
  await client.withRun("ts-agent", { title: "approvals" }, async (run) => {
    id = run.id;
    for (const path of ["/tmp/a", "/etc/b"]) {
      if (await run.waitForApproval("rm", { path })) await run.callTool("rm", (args) => ran.push(args.path), { path });
    }
    await run.step("asked twice");
  });
  assert.deepEqual(ran, ["/tmp/a"]);
  const row = await read(id);
  assert.deepEqual([row.status, row.totals.steps], ["completed", 1]);
});

test("streaming past the token budget is stopped: Stopped names it, the run ends budget_exhausted", async () => {
  const client = new Client(URL, KEY, options);
  let id, caught;
  const value = await client.withRun("ts-agent", { token_budget: 30 }, async (run) => {
    id = run.id;
    try {
      for (;;) { // a greedy agent: it never looks at its own spend
        run.stream("tick ");
        run.usage(5, 5);
        await run.step();
      }
    } catch (error) {
      caught = error;
      throw error;
    }
  });
  assert.equal(value, undefined);
  assert.ok(caught instanceof Stopped && caught instanceof Cancelled, String(caught));
  assert.equal(caught.reason, "budget_exhausted");
  const row = await read(id);
  assert.deepEqual([row.status, row.termination_reason, row.truncated, row.totals.steps],
    ["completed", "budget_exhausted", true, 3]);
});

test("a stop heard on the control channel while idle interrupts a sleep and settles as it says", async () => {
  const client = new Client(URL, KEY, options);
  let id, caught, runRef = {};
  await client.withRun("ts-agent", { token_budget: 20 }, async (run) => {
    id = run.id;
    runRef = run;
    // The socket says when it is ready; a long-poll is in flight from the start (it says so on return).
    if (SOCKET) await until(() => run.controlVia === "socket");
    await run.step("over", { tokens_out: 25 }); // committed; the server then asks the stop
    try {
      for (;;) await run.sleep(60_000); // no checkpoint here: the stop must come to it
    } catch (error) {
      caught = error;
      throw error;
    }
  });
  assert.ok(caught instanceof Stopped, String(caught));
  assert.equal(caught.reason, "budget_exhausted");
  assert.equal(runRef.controlVia, viaExpected);
  const row = await read(id);
  assert.deepEqual([row.status, row.termination_reason, row.truncated], ["completed", "budget_exhausted", true]);
});
