from runs.models import Run


def test_create_claim_settle(running_run):
    from runs import transitions

    run = running_run()
    assert transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
