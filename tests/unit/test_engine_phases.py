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


def test_a_load_with_a_recorded_choice_says_it_applies_that_mode_instead_of_measuring(tmp_path, monkeypatch):
    import re

    from models.testfaults import NetFaultModel, testfaults

    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(NetFaultModel, "optimize_candidates", lambda self, device: ("jit",))  # no compile: seconds
    config = model_config(testfaults, {"optimizable": True}, "TESTFAULTS.toml")
    defaults = ObjectSchema(testfaults.params_schema(config), "parameter").with_defaults({})
    loads = []
    for _ in range(2):  # a start, then a restart with the same state directory
        engine = Engine(testfaults, config, "cpu", inline_runner, default_params=defaults, optimize="auto")
        phases: list[str] = []
        engine.on_phase = phases.append
        engine._load_sync(2)
        loads.append((phases, engine.optimization))
    (measured, first), (applied, second) = loads
    assert measured[2:4] == ["measuring mode 1 of 1 (jit)", "timing eager and 1 mode(s) that passed the accuracy gate"]
    chosen = first.chosen.name
    assert second.chosen.name == chosen and second.recorded is not None and second.outcomes == []
    assert applied == ["building the model and loading its weights",
                       "choosing the execution mode (backend.optimize auto)",
                       f"applying {chosen}, the mode measured {second.recorded.when} (recorded: not measured again)",
                       "warming up (a batch of 2)"]
    assert re.match(rf"TESTFAULTS: optimize auto chose {chosen}, batch 2: as measured ", second.line), second.line
