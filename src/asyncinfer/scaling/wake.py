"""Wake on submit: take a model's compute from zero to one at once when a job arrives.

Alarm-driven scaling needs metric datapoints before it acts (the ``BacklogWithoutCapacity`` step
policy: at least one 1-minute datapoint, plus publication delay; SageMaker's documented
``HasBacklogWithoutCapacity`` alarm: two). The submit path calls :func:`wake_on_submit` after the
job is queued; when the model's service is at zero it asks for one worker right away:

* ECS (``ASYNCINFER_ECS_CLUSTER`` + ``ASYNCINFER_ECS_SERVICES``): ``DescribeServices``; when
  ``desiredCount`` is 0, ``UpdateService(desiredCount=1)``. Application Auto Scaling keeps
  managing the service afterwards (a desired count set outside it is a documented way to change
  capacity; the scaling policies adjust from there).
* SageMaker (``ASYNCINFER_SAGEMAKER_ENDPOINTS``): ``DescribeEndpoint``; when the variant's
  ``DesiredInstanceCount`` (else ``CurrentInstanceCount``) is 0 and the endpoint is
  ``InService``, ``UpdateEndpointWeightsAndCapacities`` with ``DesiredInstanceCount=1`` (the call
  Application Auto Scaling itself makes for ``sagemaker:variant:DesiredInstanceCount``). An
  endpoint that is ``Updating`` is already changing capacity: nothing to do.

It is cheap: a model found not at zero (or just woken) is remembered for ``cache_seconds``
(``ASYNCINFER_WAKE_CACHE_SECONDS``, default 30), so a stream of submits makes one Describe call
per model per Lambda instance and period. It never fails a submit: AWS errors are logged and
remembered for a few seconds; the alarm-driven step policy remains the fallback.
Without any of these variables (the local stack, tests) it does nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.core.settings_parts import ScalingSettings

log = logging.getLogger("asyncinfer.scaling")

#: Seconds a failed wake attempt is remembered before the next submit tries again.
ERROR_CACHE_SECONDS = 5.0
#: SageMaker production variant name of the CDK app's endpoints.
SAGEMAKER_VARIANT = "AllTraffic"

#: Outcomes of :meth:`Waker.wake`.
WOKEN = "woken"  # it was at zero; one worker asked for
AWAKE = "awake"  # not at zero (looked up now)
CACHED = "cached"  # not at zero (remembered)
UNMANAGED = "unmanaged"  # no service configured for this model
ERROR = "error"  # the lookup or the update failed (logged)


@dataclass(kw_only=True)
class WakeTargets:
    """Where each model runs: ECS services of one cluster, or SageMaker endpoints."""

    ecs_cluster: str = ""
    ecs_services: Mapping[str, str] = field(default_factory=dict)
    sagemaker_endpoints: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: ScalingSettings) -> WakeTargets:
        """The targets of the scaling part of the settings."""
        return cls(
            ecs_cluster=settings.ecs_cluster,
            ecs_services=dict(settings.ecs_services),
            sagemaker_endpoints=dict(settings.sagemaker_endpoints),
        )

    def key(self) -> tuple[Any, ...]:
        return (
            self.ecs_cluster,
            tuple(sorted(self.ecs_services.items())),
            tuple(sorted(self.sagemaker_endpoints.items())),
        )

    def __bool__(self) -> bool:
        return bool((self.ecs_cluster and self.ecs_services) or self.sagemaker_endpoints)


class Waker:
    """Wakes models at zero; remembers the ones that are not for ``cache_seconds``.

    Args:
        targets: the services or endpoints per model.
        ecs / sagemaker: boto3 clients (built lazily from ``settings`` when omitted).
        settings: for building clients.
        cache_seconds: how long "not at zero" is trusted.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        targets: WakeTargets,
        *,
        settings: ScalingSettings | None = None,
        ecs: Any = None,
        sagemaker: Any = None,
        cache_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.targets = targets
        self.settings = settings
        self._ecs = ecs
        self._sagemaker = sagemaker
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()
        self.calls = 0  # AWS calls made (for tests and logs)

    def _client(self, name: str) -> Any:
        if name == "ecs":
            if self._ecs is None:
                self._ecs = clients.client("ecs", self.settings)
            return self._ecs
        if self._sagemaker is None:
            self._sagemaker = clients.client("sagemaker", self.settings)
        return self._sagemaker

    def wake(self, model: str) -> str:
        """Make sure ``model`` has at least one worker asked for; returns the outcome."""
        t = self.targets
        managed = (t.ecs_cluster and model in t.ecs_services) or model in t.sagemaker_endpoints
        if not managed:
            return UNMANAGED
        now = self.clock()
        with self._lock:
            if self._until.get(model, 0.0) > now:
                return CACHED
            # Claim the slot so that concurrent submits in this process do not call AWS too.
            self._until[model] = now + ERROR_CACHE_SECONDS
        try:
            if t.ecs_cluster and model in t.ecs_services:
                outcome = self._wake_ecs(t.ecs_cluster, t.ecs_services[model])
            else:
                outcome = self._wake_sagemaker(t.sagemaker_endpoints[model])
        except Exception as exc:  # never fail a submit over scaling
            log.warning("wake %s failed: %s", model, exc)
            return ERROR
        with self._lock:
            self._until[model] = self.clock() + self.cache_seconds
        if outcome == WOKEN:
            log.info("wake: %s was at zero; asked for one worker", model)
        return outcome

    def _wake_ecs(self, cluster: str, service: str) -> str:
        ecs = self._client("ecs")
        self.calls += 1
        svcs = ecs.describe_services(cluster=cluster, services=[service]).get("services", [])
        if not svcs:
            raise LookupError(f"ECS service {service} not found in {cluster}")
        if int(svcs[0].get("desiredCount", 0)) > 0:
            return AWAKE
        self.calls += 1
        ecs.update_service(cluster=cluster, service=service, desiredCount=1)
        return WOKEN

    def _wake_sagemaker(self, endpoint: str) -> str:
        sm = self._client("sagemaker")
        self.calls += 1
        desc = sm.describe_endpoint(EndpointName=endpoint)
        if desc.get("EndpointStatus") != "InService":
            return AWAKE  # Creating / Updating: capacity is already changing
        variants = desc.get("ProductionVariants") or []
        variant = next(
            (v for v in variants if v.get("VariantName") == SAGEMAKER_VARIANT),
            variants[0] if variants else {},
        )
        count = variant.get("DesiredInstanceCount", variant.get("CurrentInstanceCount", 0))
        if int(count or 0) > 0:
            return AWAKE
        self.calls += 1
        sm.update_endpoint_weights_and_capacities(
            EndpointName=endpoint,
            DesiredWeightsAndCapacities=[
                {
                    "VariantName": variant.get("VariantName", SAGEMAKER_VARIANT),
                    "DesiredInstanceCount": 1,
                }
            ],
        )
        return WOKEN


_waker: Waker | None = None
_waker_key: tuple[Any, ...] | None = None
_waker_lock = threading.Lock()


def waker_for(settings: Settings | ScalingSettings) -> Waker | None:
    """The process-wide :class:`Waker` for ``settings`` (its scaling part; rebuilt when the
    targets change); ``None`` when no service is configured."""
    global _waker, _waker_key
    if isinstance(settings, Settings):
        settings = settings.scaling
    targets = WakeTargets.from_settings(settings)
    if not targets:
        return None
    key = (*targets.key(), settings.wake_cache_seconds)
    with _waker_lock:
        if _waker is None or _waker_key != key:
            _waker = Waker(targets, settings=settings, cache_seconds=settings.wake_cache_seconds)
            _waker_key = key
        return _waker


def wake_on_submit(settings: Settings | ScalingSettings, model: str) -> str:
    """Called by :meth:`asyncinfer.jobs.service.JobService.submit` after a job is queued."""
    waker = waker_for(settings)
    return waker.wake(model) if waker is not None else UNMANAGED
