"""BeginStep and EndStep answers, from the step engine's results (transport only)."""

from __future__ import annotations

from agentrt.runtime.v1 import worker_service_pb2 as pb
from agentrt_core.resolution import BoundDefinition
from runtime_service import proto_map as pm
from runtime_service.records import Step
from runtime_service.step_engine import Begun


def begin_step_response(begun: Begun, bound: BoundDefinition) -> pb.BeginStepResponse:
    assert begun.step is not None  # (an answer without a step is an error, raised before)
    response = pb.BeginStepResponse(
        step=pm.step(begun.step), resolved=pm.resolved_for(bound, begun.step)
    )
    # (Set only when there is something to set: the common answer has neither, and each
    # keyword costs the constructor as much as a field.)
    if begun.steers:
        response.steer_inputs.extend(pm.input_(i) for i in begun.steers)
    if begun.existing:
        response.existing = True
    return response


def end_step_response(step: Step) -> pb.EndStepResponse:
    return pb.EndStepResponse(step=pm.step(step))
