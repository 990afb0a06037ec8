"""The scheduled whole-pipeline deployment is built in code with its cron schedule."""

from flows.serve import CRON, DEPLOYMENT_NAME, HOST, build_deployment


def test_deployment_has_cron_schedule():
    dep = build_deployment("params.yaml")
    assert dep.name == DEPLOYMENT_NAME
    assert dep.flow_name == "fedcache-pipeline"
    assert dep.parameters == {"params_file": "params.yaml"}
    crons = [s.schedule.cron for s in dep.schedules]
    assert crons == [CRON] == ["0 3 * * *"]
    assert HOST == "127.0.0.1"
