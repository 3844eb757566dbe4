"""This package's settings are not a flow's in this process either: lfx's env-fallback deny-list.

A field that loads from a global variable names one. When Langflow has no variable of that name
(``LANGFLOW_FALLBACK_TO_ENV_VAR``, default true), or always in bare lfx (``lfx run``, ``lfx
serve``: no database), lfx resolves the name from the process environment. Every such read goes
through one function, ``lfx.utils.env_var_security.safe_getenv``, which answers ``None`` (as if
the variable were unset) for a name ``is_protected_env_var`` matches: a prefix in the module's
``_RESERVED_ENV_PREFIXES`` (``LANGFLOW_``, ``LFX_``) or a name in ``_RESERVED_ENV_NAMES``. Those
two are module globals read at each call, so adding this package's names to them denies them to
every caller (field, table column, variable service, knowledge bases, model credentials) in
this process, with lfx's own behaviour for a denied name.

:func:`install` adds what the deny-list does not already match of :data:`WITHHELD_PREFIXES` and
:data:`WITHHELD_NAMES` (the Rust ``is_withheld_name``'s lists: ``CREATEOS_*``,
``OPEN_SANDBOX_*``; the ``LANGFLOW_*`` ones are lfx's already). The package installs it on
import (``__init__``), so it holds in every process that imports the package: lfx builds its
executor service from every ``lfx.executors`` entry point, Langflow loads the component bundle at
start-up, and lfx imports the sandbox backend it is told to trust. Idempotent and thread-safe.

The module is byte-identical in lfx 1.12.0, 1.12.8 and 1.13.0 (read from their wheels); what
holds it to a shape is not a version list but a fingerprint. It patches lfx internals, so it is
fingerprinted: the two functions must take one parameter
``name``, ``safe_getenv`` must call ``is_protected_env_var``, which must read both globals, a
tuple and a frozenset of upper-case strings; and after the change every withheld name must read
as protected. Anything else installs nothing (what was changed is put back) and logs one
WARNING; ``doctor`` reports it (:func:`status`).

What it cannot do: code a flow runs in this process (a custom component, with
``LANGFLOW_ALLOW_CUSTOM_COMPONENTS`` on) reads ``os.environ`` itself, and any file the process
can read. A secret given as a file (``CREATEOS_SANDBOX_API_KEY_FILE`` and the like) is not in the
environment at all, so neither a field nor a child process that inherits the environment sees it.
"""

from __future__ import annotations

import threading
import types
from typing import Any, cast

__all__ = ["WITHHELD_NAMES", "WITHHELD_PREFIXES", "install", "status"]

#: Name prefixes that configure this package or its providers (upper case): the Rust
#: ``sandbox_core::withheld::WITHHELD_PREFIXES`` (a test compares the two).
WITHHELD_PREFIXES: tuple[str, ...] = ("CREATEOS_", "OPEN_SANDBOX_", "LANGFLOW_SANDBOX_", "LANGFLOW_EXECUTOR_")
#: Whole names withheld besides the prefixes: ``sandbox_core::withheld::WITHHELD_NAMES``.
WITHHELD_NAMES: tuple[str, ...] = (
    "LANGFLOW_DATABASE_URL",
    "LANGFLOW_REDIS_URL",
    "LANGFLOW_PROMETHEUS_ENABLED",
    "LANGFLOW_PROMETHEUS_PORT",
)

#: lfx's module holding the deny-list.
MODULE = "lfx.utils.env_var_security"
_LOGGER = "langflow_sandbox_createos"

_lock = threading.Lock()
#: ``(covered, what)`` once :func:`install` ran; ``None`` before.
_status: tuple[bool, str] | None = None
#: Set when lfx is not installed at all (nothing to protect, nothing to warn about).
_NO_LFX = "no lfx"


def _probe_names() -> list[str]:
    """A name under each withheld prefix, in both cases, and each withheld name."""
    names = [f"{prefix}API_KEY" for prefix in WITHHELD_PREFIXES]
    names += list(WITHHELD_NAMES)
    return names + [name.lower() for name in names]


def _shape_problem(mod: Any) -> str | None:
    """Why ``mod`` is not the deny-list this module knows how to extend, or ``None``."""
    check = getattr(mod, "is_protected_env_var", None)
    getenv = getattr(mod, "safe_getenv", None)
    for label, fn in (("is_protected_env_var", check), ("safe_getenv", getenv)):
        if not isinstance(fn, types.FunctionType):
            return f"{MODULE}.{label} is not a function"
        params = _parameters(fn)
        if params != ["name"]:
            return f"{MODULE}.{label} takes {params}, not ['name']"
    assert isinstance(check, types.FunctionType) and isinstance(getenv, types.FunctionType)
    if "is_protected_env_var" not in getenv.__code__.co_names:
        return "safe_getenv does not call is_protected_env_var"
    if not {"_RESERVED_ENV_PREFIXES", "_RESERVED_ENV_NAMES"} <= set(check.__code__.co_names):
        return "is_protected_env_var does not read _RESERVED_ENV_PREFIXES and _RESERVED_ENV_NAMES"
    prefixes: Any = getattr(mod, "_RESERVED_ENV_PREFIXES", None)
    names: Any = getattr(mod, "_RESERVED_ENV_NAMES", None)
    if not isinstance(prefixes, tuple) or not _upper_names(cast("tuple[object, ...]", prefixes)):
        return "_RESERVED_ENV_PREFIXES is not a tuple of upper-case names"
    if not isinstance(names, frozenset) or not _upper_names(cast("frozenset[object]", names)):
        return "_RESERVED_ENV_NAMES is not a frozenset of upper-case names"
    return None


def _parameters(fn: types.FunctionType) -> list[str]:
    """Every parameter ``fn`` declares, by name (``*args`` and ``**kwargs`` included), read from
    its code object (``inspect`` would cost the package's import more than all the rest)."""
    code = fn.__code__
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # CO_VARARGS, CO_VARKEYWORDS
    return list(code.co_varnames[:count])


def _upper_names(items: tuple[object, ...] | frozenset[object]) -> bool:
    """Whether every item is an upper-case string."""
    return all(isinstance(item, str) and item == item.upper() for item in items)


def _version() -> str:
    """The installed lfx's version, for messages."""
    try:
        from importlib.metadata import version

        return version("lfx")
    except Exception:  # noqa: BLE001 - only for a message
        return "unknown"


def _install_locked() -> tuple[bool, str]:
    """Extends lfx's deny-list if its shape is the known one; ``(covered, what)``. May raise
    only on an lfx whose functions fail when called (``install`` catches it)."""
    try:
        import importlib

        mod = importlib.import_module(MODULE)
    except ImportError:
        return False, f"{_NO_LFX}: {MODULE} cannot be imported, so there is no env-var fallback to guard here"
    problem = _shape_problem(mod)
    if problem is not None:
        return False, f"lfx {_version()}'s env-var deny-list has a shape this package does not know ({problem})"
    check = mod.is_protected_env_var
    if all(check(name) for name in _probe_names()):
        return True, "lfx's env-var deny-list already covers every name this package withholds"
    ns: dict[str, Any] = vars(mod)  # lfx's module globals, fingerprinted above
    old_prefixes: tuple[str, ...] = ns["_RESERVED_ENV_PREFIXES"]
    old_names: frozenset[str] = ns["_RESERVED_ENV_NAMES"]
    add_prefixes = tuple(p for p in WITHHELD_PREFIXES if not check(p))
    add_names = frozenset(n for n in WITHHELD_NAMES if not check(n))
    ns["_RESERVED_ENV_PREFIXES"] = old_prefixes + add_prefixes
    ns["_RESERVED_ENV_NAMES"] = old_names | add_names
    if not all(check(name) for name in _probe_names()):
        ns["_RESERVED_ENV_PREFIXES"] = old_prefixes
        ns["_RESERVED_ENV_NAMES"] = old_names
        return False, f"lfx {_version()}'s env-var deny-list did not take this package's names (put back as it was)"
    added = ", ".join([f"{p}*" for p in add_prefixes] + sorted(add_names))
    return True, f"lfx's env-var deny-list extended with {added} in this process"


def install() -> bool:
    """Put this package's names on lfx's env-fallback deny-list in this process, once.

    Returns whether the deny-list covers them. Logs one WARNING (per process) when lfx's
    module has an unknown shape; never raises (importing the package must not fail on it).
    """
    global _status
    with _lock:
        first = _status is None
        try:
            again = _install_locked()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            again = (False, f"extending lfx's env-var deny-list failed: {type(exc).__name__}: {exc}")
        # Called again (lfx's module may have been reloaded since): the first answer, which
        # says what was added, is kept while it holds.
        if _status is None or not (_status[0] and again[0]):
            _status = again
        if first and not _status[0] and not _status[1].startswith(_NO_LFX):
            import logging

            logging.getLogger(_LOGGER).warning(
                "%s; a flow field naming CREATEOS_* or OPEN_SANDBOX_* can read that variable from this "
                "process's environment (LANGFLOW_FALLBACK_TO_ENV_VAR); give the secrets as files "
                "(CREATEOS_SANDBOX_API_KEY_FILE, ...), or in Langflow set LANGFLOW_FALLBACK_TO_ENV_VAR=false; "
                "`python -m langflow_sandbox_createos doctor` says more",
                _status[1],
            )
        return _status[0]


def status() -> tuple[bool, str]:
    """``(covered, what)``: whether lfx's deny-list covers this package's names in this
    process, and how (installs first when nothing did yet)."""
    install()
    assert _status is not None
    return _status
