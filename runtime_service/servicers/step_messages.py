"""BeginStep and EndStep answers, from the step engine's results (transport only)."""

from __future__ import annotations

from agentrt.runtime.v1 import worker_service_pb2 as pb
from runtime_service import proto_map as pm
from runtime_service.records import Step
from runtime_service.resolution import BoundDefinition
from runtime_service.step_engine import Begun


def begin_step_response(begun: Begun, bound: BoundDefinition) -> pb.BeginStepResponse:
    assert begun.step is not None  # (an answer without a step is an error, raised before)
    return pb.BeginStepResponse(
        step=pm.step(begun.step),
        steer_inputs=[pm.input_(i) for i in begun.steers],
        existing=begun.existing,
        resolved=pm.resolved_for(bound, begun.step),
    )


def end_step_response(step: Step) -> pb.EndStepResponse:
    return pb.EndStepResponse(step=pm.step(step))
