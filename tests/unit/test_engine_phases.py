"""What a loading model says it does: the engine's phases, which /ready's 503 and the supervisor's status show."""

from __future__ import annotations

from svc.contract.schema import ObjectSchema
from svc.infra.process import inline_runner
from svc.model.api import model_config
from svc.modelserver.engine import Engine


def test_the_load_reports_building_each_mode_it_measures_and_the_warm_up():
    from models.testfaults import testfaults

    config = model_config(testfaults, {"optimizable": True}, "TESTFAULTS.toml")
    defaults = ObjectSchema(testfaults.params_schema(config), "parameter").with_defaults({})
    engine = Engine(testfaults, config, "cpu", inline_runner, default_params=defaults, optimize="jit")
    phases: list[str] = []
    engine.on_phase = phases.append
    engine._load_sync(2)
    assert phases == ["building the model and loading its weights",
                      "choosing the execution mode (backend.optimize jit)",
                      "measuring mode 1 of 1 (jit)",
                      "warming up (a batch of 2)"]
    assert engine.optimization.chosen.name == "jit"
