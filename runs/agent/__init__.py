"""The agent engine: an asyncio agent loop with cooperative cancellation, and the worker.

    cancel.py      CancelSignal: the one-shot, resettable cancel token
    racing.py      biased races and cancel-aware sleeps (the checkpoint mechanisms)
    loop.py        Engine: the turn loop; THE CHECKPOINT TABLE is its docstring
    model.py       one model call: gate, stream, fallback, retries, breaker
    dispatch.py    the tool phase: policy, approval, sequential calls and parallel waves
    approval.py    suspend for an approval and wait for the answer
    tools.py       the tool contract and the built-ins (sleep, echo, write_file)
    providers/     scripted (demos, tests) and openai (any compatible endpoint)
    runner.py      one claimed run: cancel delivery, heartbeats, finalize()
    worker.py      Worker: claim, run, heartbeat, settle; SIGTERM semantics
    control.py     the control plane: every run's cancels on one connection, read first
    deltas.py      the data plane: every run's deltas, one batch per interval
    progress.py    one run's in-flight step, coalesced at the source for deltas.py
    heartbeats.py  one heartbeat statement per interval for all of a worker's runs
    fastpath.py    the channel layer, best effort (the heartbeat is the slow path)
    db_pool.py     database calls from the loop, on a bounded pool of owned threads;
                   dropped connections replaced
    holding.py     hold a finished step or an outcome through a database outage
    demo.py        the demo feeder; in_process.py: workers inside the server process

It knows nothing of HTTP or templates; it changes runs only through runs.transitions.
"""
