"""Operator commands: ``python -m langflow_sandbox_createos doctor``."""

from __future__ import annotations

import argparse
import sys


def _doctor() -> int:
    # lfx's settings are what a run would see; building them imports lfx (a few seconds).
    from lfx.services.deps import get_settings_service
    from lfx.utils.sandbox.base import _sandbox_settings

    from . import _native

    # No settings service means lfx could not start; the native doctor reports that.
    settings = _sandbox_settings() if get_settings_service() is not None else None
    ok, report = _native.NativeBackend().doctor(settings)
    print(report)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m langflow_sandbox_createos``."""
    parser = argparse.ArgumentParser(
        prog="python -m langflow_sandbox_createos",
        description="Operator tools for the CreateOS sandbox backend.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "doctor",
        help="check configuration and credential and show what a run would get; creates no guest",
    )
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return _doctor()
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
