"""lfx's settings as an operator sets them: which ``LANGFLOW_*`` variable lfx refuses, and why.

lfx builds its settings once per process from the environment (pydantic-settings, prefix
``LANGFLOW_``). A value it refuses leaves lfx without a settings service, and lfx then runs no
flow: ``lfx run`` says only "Settings service not found", and the reason (logged by lfx below
its default level) is lost. Here lfx's own ``ValidationError`` is read and each field mapped back
to the variable an operator sets, with lfx's own reason: for ``doctor`` (:func:`load`), and once
per process when lfx imports the sandbox backend while building its settings
(:func:`warn_once_about_sandbox_settings`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lfx.utils.sandbox.base import _SandboxSettings  # pyright: ignore[reportPrivateUsage]

__all__ = ["load", "problems_of", "sandbox_problems", "variable", "warn_once_about_sandbox_settings"]

#: The logger of the one warning a process with a refused ``LANGFLOW_SANDBOX_*`` value gets.
LOGGER = "langflow_sandbox_createos.lfx_settings"
#: The longest value quoted back (only ``LANGFLOW_SANDBOX_*`` values are quoted: others may be
#: secrets, such as a database URL).
_MAX_QUOTED = 80

_warned = False


def _settings_class() -> Any:
    from lfx.services.settings.base import Settings

    return Settings


def variable(field: str, settings_class: Any = None) -> str:
    """The environment variable that sets lfx's settings field ``field``: its alias when it has
    one, else lfx's prefix (``LANGFLOW_``) and the field's name in upper case."""
    cls = _settings_class() if settings_class is None else settings_class
    info = cls.model_fields.get(field)
    alias = None
    if info is not None:
        alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
    if isinstance(alias, str) and alias:
        return alias.upper()
    prefix = str(cls.model_config.get("env_prefix") or "")
    return f"{prefix}{field}".upper()


def _quoted(var: str) -> str:
    """`` ='value'`` for a ``LANGFLOW_SANDBOX_*`` variable that is set (case-insensitively, as
    lfx reads it), bounded; nothing for any other variable."""
    if not var.startswith("LANGFLOW_SANDBOX_"):
        return ""
    raw = next((v for k, v in os.environ.items() if k.upper() == var), None)
    if raw is None:
        return ""
    shown = raw if len(raw) <= _MAX_QUOTED else raw[:_MAX_QUOTED] + "..."
    return f"={shown!r}"


def problems_of(exc: Any, settings_class: Any = None) -> list[tuple[str | None, str]]:
    """Each error of lfx's settings ``ValidationError`` as ``(variable, lfx's reason)``; the
    variable is ``None`` for an error that names no field."""
    out: list[tuple[str | None, str]] = []
    for err in exc.errors():
        loc = err.get("loc") or ()
        field = loc[0] if loc and isinstance(loc[0], str) else None
        reason = str(err.get("msg") or "invalid value")
        if field is None:
            out.append((None, reason))
            continue
        var = variable(field, settings_class)
        out.append((var, f"{var}{_quoted(var)} refused: {reason}"))
    return out


def _sandbox_settings_of(settings: Any) -> _SandboxSettings:
    """lfx's ``_SandboxSettings`` from lfx's settings object: each of its fields is the
    settings' ``sandbox_`` field of the same name (its default where the settings lack one),
    which is how lfx's own reader (``_sandbox_settings()``) fills it for a backend."""
    import dataclasses

    from lfx.utils.sandbox.base import _SandboxSettings  # pyright: ignore[reportPrivateUsage]

    defaults = _SandboxSettings()
    values: dict[str, Any] = {}
    for field in dataclasses.fields(defaults):
        default = getattr(defaults, field.name)
        value = getattr(settings, f"sandbox_{field.name}", default)
        # lfx keeps the domains as a tuple (the settings hold a list).
        values[field.name] = tuple(value or ()) if isinstance(default, tuple) else value
    return _SandboxSettings(**values)


def load() -> tuple[_SandboxSettings | None, list[tuple[str | None, str]]]:
    """lfx's sandbox settings as a backend gets them, or ``None`` and why lfx cannot build its
    settings (``(variable, message)`` pairs). Builds lfx's settings service the way lfx does
    (``SettingsService.initialize()``, what lfx's settings factory calls), without the rest of
    lfx's service layer (a third of the time)."""
    global _warned
    # doctor reports each refused value itself; the import-time warning would say it twice.
    _warned = True
    from pydantic import ValidationError

    try:
        from lfx.services.settings.service import SettingsService

        service = SettingsService.initialize()
    except ValidationError as exc:
        return None, problems_of(exc)
    except Exception as exc:  # noqa: BLE001 - any failure of lfx's own build is the answer
        text = " ".join(str(exc).split())[:300]
        return None, [(None, f"{type(exc).__name__}: {text}")]
    return _sandbox_settings_of(service.settings), []


def sandbox_problems() -> list[tuple[str, str]]:
    """The ``LANGFLOW_SANDBOX_*`` values set in this process that lfx's own field definitions
    refuse, as ``(variable, message)``, checked one field at a time (numbers and switches; lfx's
    lists and backend name are read by lfx itself). Safe while lfx is still building its
    settings: nothing here builds them."""
    from typing import Annotated

    from pydantic import TypeAdapter, ValidationError

    cls = _settings_class()
    env = {k.upper(): v for k, v in os.environ.items()}
    out: list[tuple[str, str]] = []
    for name, info in cls.model_fields.items():
        if not name.startswith("sandbox_") or info.annotation not in (int, bool, float):
            continue
        var = variable(name, cls)
        raw = env.get(var)
        if raw is None:
            continue
        kind: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        try:
            TypeAdapter(kind).validate_python(raw)
        except ValidationError as exc:
            reason = str(exc.errors()[0].get("msg") or "invalid value")
            out.append((var, f"{var}{_quoted(var)} refused: {reason}"))
    return out


def warn_once_about_sandbox_settings() -> None:
    """Logs one WARNING per process for each ``LANGFLOW_SANDBOX_*`` value lfx refuses, with
    lfx's reason, so that ``lfx run`` says more than "Settings service not found". Never
    raises: a failure here must not stop lfx from loading the backend."""
    global _warned
    if _warned:
        return
    _warned = True
    try:
        found = sandbox_problems()
    except Exception:  # noqa: BLE001 - best effort, see above
        return
    log = logging.getLogger(LOGGER)
    for var, message in found:
        log.warning(
            "%s (lfx's own check): lfx cannot build its settings, so it runs no flow and says only "
            "'Settings service not found'; fix or unset %s (python -m langflow_sandbox_createos doctor "
            "lists every such value)",
            message,
            var,
        )
