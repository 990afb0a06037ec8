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


def test_worker_deployments_run_in_the_checkout(tmp_path):
    from flows.deploy import PIPELINE, ROOT, STAGE, build_deployments

    pipeline, stage = build_deployments(tmp_path, "other.yaml")
    assert (pipeline.flow_name, pipeline.name, stage.flow_name, stage.name) == \
        ("fedcache-pipeline", PIPELINE, "train", STAGE)
    assert [s.schedule.cron for s in pipeline.schedules] == [CRON]  # the schedule stays with the pipeline
    assert pipeline.entrypoint == "flows.pipeline.pipeline_flow"  # by module path: nothing to upload
    assert stage.parameters == {"algorithm": "fedcache", "params_file": "other.yaml", "hetero": False}
    for dep in (pipeline, stage):
        assert dep.job_variables == {"working_dir": str(tmp_path), "env": {"PYTHONPATH": str(ROOT)}}


def test_deploy_without_a_server_says_how_to_start_one(monkeypatch, capsys):
    from flows.deploy import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert main([]) == 2
    assert "make server" in capsys.readouterr().err
