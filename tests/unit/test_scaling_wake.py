"""Wake on submit (asyncinfer.scaling.wake): 0 -> 1 at once, cached, never failing a submit."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from asyncinfer.core.settings import Settings
from asyncinfer.scaling import wake
from asyncinfer.scaling.wake import Waker, WakeTargets


class FakeEcs:
    def __init__(self, desired: int = 0, fail: bool = False) -> None:
        self.desired = desired
        self.fail = fail
        self.updates: list[dict[str, Any]] = []
        self.describes = 0

    def describe_services(self, cluster: str, services: list[str]) -> dict[str, Any]:
        self.describes += 1
        if self.fail:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "Describe")
        return {"services": [{"serviceName": services[0], "desiredCount": self.desired}]}

    def update_service(self, cluster: str, service: str, desiredCount: int) -> None:
        self.updates.append({"cluster": cluster, "service": service, "desired": desiredCount})
        self.desired = desiredCount


class FakeSageMaker:
    def __init__(self, desired: int = 0, status: str = "InService") -> None:
        self.desired = desired
        self.status = status
        self.updates: list[dict[str, Any]] = []

    def describe_endpoint(self, EndpointName: str) -> dict[str, Any]:
        return {
            "EndpointStatus": self.status,
            "ProductionVariants": [
                {
                    "VariantName": "AllTraffic",
                    "CurrentInstanceCount": self.desired,
                    "DesiredInstanceCount": self.desired,
                }
            ],
        }

    def update_endpoint_weights_and_capacities(self, **kwargs: Any) -> None:
        self.updates.append(kwargs)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


ECS = WakeTargets(ecs_cluster="c", ecs_services={"echo": "svc-echo"})


def test_ecs_at_zero_is_woken_once_then_cached() -> None:
    ecs, clock = FakeEcs(desired=0), Clock()
    w = Waker(ECS, ecs=ecs, cache_seconds=30, clock=clock)
    assert w.wake("echo") == wake.WOKEN
    assert ecs.updates == [{"cluster": "c", "service": "svc-echo", "desired": 1}]
    for _ in range(50):  # a stream of submits: no more AWS calls
        assert w.wake("echo") == wake.CACHED
    assert ecs.describes == 1
    clock.t += 31
    assert w.wake("echo") == wake.AWAKE  # desired is 1 now: looked up, not updated
    assert len(ecs.updates) == 1 and ecs.describes == 2


def test_ecs_not_at_zero_is_left_alone() -> None:
    ecs = FakeEcs(desired=3)
    assert Waker(ECS, ecs=ecs).wake("echo") == wake.AWAKE
    assert ecs.updates == []


def test_unmanaged_model_makes_no_call() -> None:
    ecs = FakeEcs()
    assert Waker(ECS, ecs=ecs).wake("smollm2-135m-instruct") == wake.UNMANAGED
    assert ecs.describes == 0


def test_errors_never_raise_and_are_retried_after_a_few_seconds() -> None:
    ecs, clock = FakeEcs(fail=True), Clock()
    w = Waker(ECS, ecs=ecs, clock=clock)
    assert w.wake("echo") == wake.ERROR
    assert w.wake("echo") == wake.CACHED  # no hammering right after a failure
    clock.t += wake.ERROR_CACHE_SECONDS + 0.1
    ecs.fail = False
    assert w.wake("echo") == wake.WOKEN


@pytest.mark.parametrize(
    ("desired", "status", "outcome", "updates"),
    [
        (0, "InService", wake.WOKEN, 1),
        (2, "InService", wake.AWAKE, 0),
        (0, "Updating", wake.AWAKE, 0),
    ],
)
def test_sagemaker(desired: int, status: str, outcome: str, updates: int) -> None:
    sm = FakeSageMaker(desired=desired, status=status)
    w = Waker(WakeTargets(sagemaker_endpoints={"echo": "ep-echo"}), sagemaker=sm)
    assert w.wake("echo") == outcome
    assert len(sm.updates) == updates
    if updates:
        assert sm.updates[0] == {
            "EndpointName": "ep-echo",
            "DesiredWeightsAndCapacities": [
                {"VariantName": "AllTraffic", "DesiredInstanceCount": 1}
            ],
        }


def test_settings_read_the_targets() -> None:
    s = Settings.from_env(
        {
            "ASYNCINFER_ECS_CLUSTER": "c",
            "ASYNCINFER_ECS_SERVICES": '{"echo": "svc"}',
            "ASYNCINFER_SAGEMAKER_ENDPOINTS": '{"echo": "ep"}',
            "ASYNCINFER_WAKE_CACHE_SECONDS": "12",
        }
    )
    assert (s.ecs_cluster, s.ecs_services, s.sagemaker_endpoints) == (
        "c",
        {"echo": "svc"},
        {"echo": "ep"},
    )
    assert s.wake_cache_seconds == 12
    w = wake.waker_for(s)
    assert w is not None and w.cache_seconds == 12 and wake.waker_for(s) is w


def test_nothing_configured_is_a_no_op() -> None:
    assert wake.waker_for(Settings()) is None
    assert wake.wake_on_submit(Settings(), "echo") == wake.UNMANAGED


def test_submit_wakes_the_model(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job service's submit calls wake_on_submit once the job is queued."""
    from asyncinfer.functions.api.schemas import JobRequest
    from asyncinfer.jobs.service import JobService

    calls: list[str] = []
    monkeypatch.setattr(
        "asyncinfer.jobs.service.wake_on_submit", lambda s, model: calls.append(model)
    )
    JobService(settings).submit("t1", JobRequest(model="echo", input={"n": 1}))
    assert calls == ["echo"]
