"""Reading :class:`~asyncinfer.core.settings.Settings` from an environment mapping: the
pydantic-settings source over a given mapping, the one-line-per-variable errors, and the rules
that fill what the environment leaves out (the model list, the naming rule's queue URLs and
names). :meth:`Settings.from_env` is the one caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource

from asyncinfer.core import envvars as ev
from asyncinfer.core import naming
from asyncinfer.core.errors import ConfigError

if TYPE_CHECKING:
    from asyncinfer.core.settings import Settings


def read_env(settings_cls: type[BaseSettings], env: Mapping[str, str]) -> dict[str, Any]:
    """``{field: raw value}`` of the variables of ``env`` that some field of ``settings_cls``
    reads (its ``validation_alias``); an empty variable is unset."""
    return dict(_MappingEnvSource(settings_cls, env)())


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``,
    reading only fields that name a variable (``validation_alias``)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._mapping = env
        super().__init__(settings_cls, case_sensitive=True, env_ignore_empty=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Only the variables named by aliases: with ``populate_by_name`` pydantic-settings
        # would also read a variable spelled like a field (``table_name``).
        names = variables(self.settings_cls)
        return {k: v for k, v in self._mapping.items() if v != "" and k in names}


@lru_cache(maxsize=4)
def variables(settings_cls: type[BaseSettings]) -> frozenset[str]:
    """Every environment variable some field of ``settings_cls`` reads."""
    out: set[str] = set()
    for field in settings_cls.model_fields.values():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            out.update(c for c in alias.choices if isinstance(c, str))
        elif isinstance(alias, str):
            out.add(alias)
    return frozenset(out)


def problems(exc: ValidationError) -> list[str]:
    """One line per error of ``exc``: ``VAR='value': why``."""
    out = []
    for err in exc.errors():
        where = str(err["loc"][0]) if err["loc"] else "settings"
        why = str(err["msg"]).removeprefix("Value error, ")
        out.append(f"{where}={err['input']!r}: {why}")
    return out


def derive(settings: Settings, *, models_given: bool) -> Settings:
    """Fill what the environment leaves to rules: the model list (default: the queue keys that
    name no priority class) and, with a resource prefix, the queue URLs, ECS service and
    SageMaker endpoint names from the naming rule (:mod:`asyncinfer.core.naming`).

    Raises:
        ConfigError: the prefix is set without the models or the queue URL base.
    """
    update: dict[str, Any] = {}
    models = settings.models
    if not models_given:
        models = update["models"] = [m for m in settings.queue_urls if "#" not in m]
    prefix = settings.resource_prefix
    if prefix:
        if not models:
            raise ConfigError(f"{ev.RESOURCE_PREFIX} needs {ev.MODELS}")
        base = settings.queue_url_base
        if not settings.queue_urls:
            if not base.endswith("/"):
                raise ConfigError(f"{ev.RESOURCE_PREFIX} needs {ev.QUEUE_URL_BASE} ending in '/'")
            update["queue_urls"] = naming.queue_urls(base, prefix, models)
        if settings.compute == "ecs" and not settings.ecs_services:
            update["ecs_services"] = {m: naming.ecs_service_name(prefix, m) for m in models}
        if settings.compute == "sagemaker" and not settings.sagemaker_endpoints:
            update["sagemaker_endpoints"] = {m: naming.endpoint_name(prefix, m) for m in models}
    return settings.model_copy(update=update) if update else settings
