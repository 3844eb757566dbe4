"""Operator commands, ``python -m langflow_sandbox_createos COMMAND`` or the
``langflow-sandbox-createos`` console script: ``doctor [--surface S] [--json]``,
``reap [--older-than AGE] [--dry-run] [--provider createos|opensandbox]``, ``template build FLOW.json [--name N] [--dry-run]`` and
``gateway --listen ADDR:PORT [...]``."""

from __future__ import annotations

import argparse
import os
import sys

#: The surfaces ``doctor --surface`` accepts.
SURFACES = ("backend", "component", "executor", "opensandbox", "opensandbox-executor")


def _doctor(surfaces: list[str], as_json: bool) -> int:
    """Check every enabled surface (or those asked for); the exit code is the verdict's."""
    print("doctor: loading lfx's settings (this imports lfx: a few seconds)", file=sys.stderr, flush=True)
    from . import _native, env_fallback, lfx_settings, metrics, reach

    settings, problems = lfx_settings.load()
    try:
        code, report, as_data = _native.doctor(
            settings, problems, surfaces, reach.findings(), metrics.findings(), env_fallback.status()
        )
    except RuntimeError as exc:  # SandboxFailedError: an internal failure, not a finding
        print(f"doctor failed: {exc}", file=sys.stderr)
        return 1
    print(as_data if as_json else report, flush=True)
    return code


def _surfaces(value: str) -> list[str]:
    """``--surface``'s value: one surface or several, comma-separated."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    bad = [name for name in names if name not in SURFACES]
    if bad or not names:
        msg = f"{value!r}: choose from {', '.join(SURFACES)} (comma-separated for several)"
        raise argparse.ArgumentTypeError(msg)
    return names


def _reap_reused(older_than: str, dry_run: bool, provider: str = "createos") -> int:
    """Delete the component's reused guests (``lf-c-``) older than the limit; say what stayed."""
    from . import _native

    try:
        report = _native.reap_reused(older_than, dry_run, provider)
    except RuntimeError as exc:
        print(f"reap of reused guests failed: {exc}", file=sys.stderr)
        return 1
    lines = [
        f"{'would delete' if report.dry_run else 'deleted'} reused guest {name} ({sid}), {age:.0f}s old"
        for name, sid, age in report.deleted
    ]
    lines += [
        f"kept reused guest {name} ({sid}), " + ("age unknown" if age is None else f"{age:.0f}s old")
        for name, sid, age in report.kept
    ]
    if lines:
        print("\n".join(lines))
    for name, sid, error in report.failed:
        print(f"could not delete reused guest {name} ({sid}): {error}", file=sys.stderr)
    print(
        f"{len(report.deleted)} reused guest(s) older than {older_than} "
        f"{'would be deleted (dry run)' if report.dry_run else 'deleted'}, "
        f"{len(report.kept)} kept, {len(report.failed)} failed"
    )
    return 1 if report.failed else 0


def _age_seconds(text: str) -> float:
    """``90s``, ``30m``, ``1h``, ``2d`` (or bare seconds) as seconds; ``ValueError`` otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


def _reap_opensandbox(older_than: str | None, dry_run: bool) -> int:
    """Delete this deployment's OpenSandbox sandboxes (``created-by`` metadata) older than the
    limit (default 30m), except the component's kept ones (``lf-c-``), which only an explicit
    ``--older-than`` deletes (listing the younger ones kept); reads the ``OPEN_SANDBOX_*``
    settings."""
    from . import _native

    limit = older_than or "30m"
    try:
        seconds = _age_seconds(limit)
    except ValueError:
        print(f"reap: --older-than {limit!r} is not an age such as 90s, 30m, 1h or 2d", file=sys.stderr)
        return 2
    try:
        ids = _native.opensandbox_reap(seconds, dry_run)
    except RuntimeError as exc:
        print(f"reap failed: {exc}", file=sys.stderr)
        return 1
    verb = "would delete" if dry_run else "deleted"
    for sandbox_id in ids:
        print(f"{verb} OpenSandbox sandbox {sandbox_id}")
    print(f"{len(ids)} OpenSandbox sandbox(es) older than {limit} {'would be deleted (dry run)' if dry_run else 'deleted'}")
    if older_than is None:
        return 0
    return _reap_reused(older_than, dry_run, "opensandbox")


def _reap(dry_run: bool) -> int:
    # No lfx here: the sweep reads only the CREATEOS_* settings.
    from . import _native

    try:
        report = _native.reap(dry_run)
    # SandboxRefusedError / SandboxFailedError, both RuntimeErrors: catching them by
    # their base keeps lfx (which defines it) out of this command until something fails.
    except RuntimeError as exc:
        print(f"reap failed: {exc}", file=sys.stderr)
        return 1
    verb = "would delete" if report.dry_run else "deleted"
    for name, sandbox_id in report.deleted:
        print(f"{verb} {name} ({sandbox_id})")
    for name, sandbox_id, error in report.failed:
        print(f"could not delete {name} ({sandbox_id}): {error}", file=sys.stderr)
    outcome = "would be deleted (dry run)" if report.dry_run else "deleted"
    print(
        f"{len(report.deleted)} orphaned guest(s) {outcome}, {len(report.failed)} failed, "
        f"{report.examined} lf- guest(s) examined"
    )
    return 1 if report.failed else 0


def _template_build(flow_path: str, name: str | None, dry_run: bool) -> int:
    import json
    from importlib.metadata import version

    # lfx's own reader of a flow's requirements (what `lfx run` checks before it runs a flow).
    from lfx.utils.flow_requirements import generate_requirements_from_flow  # pyright: ignore[reportUnknownVariableType]

    from . import _native

    try:
        with open(flow_path, encoding="utf-8") as f:
            flow = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"template build failed: cannot read {flow_path}: {exc}", file=sys.stderr)
        return 1
    needs: list[str] = generate_requirements_from_flow(flow, include_lfx=False, pin_versions=True)
    try:
        template_name, dockerfile = _native.template_plan(needs, version("lfx"), name)
        if dry_run:
            print(dockerfile, end="")
            return 0
        print(f"building template {template_name} for {flow_path}", file=sys.stderr)
        template_id = _native.template_build(template_name, dockerfile)
    # SandboxRefusedError / SandboxFailedError, both RuntimeErrors.
    except RuntimeError as exc:
        print(f"template build failed: {exc}", file=sys.stderr)
        return 1
    print(f"template {template_name} is ready; run the flow in it with:", file=sys.stderr)
    print(f"CREATEOS_EXECUTOR_ROOTFS={template_id}")
    return 0


def _gateway(argv: list[str]) -> int:
    """Run the egress gateway until Ctrl-C or SIGTERM; its options are parsed natively."""
    import signal
    from types import FrameType

    from . import _native

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # SIGTERM (docker stop, systemd) stops it as Ctrl-C does: accepting ends, the process exits 0.
    signal.signal(signal.SIGTERM, _stop)
    try:
        return _native.gateway_main(argv)
    except KeyboardInterrupt:
        print("egress gateway stopped", file=sys.stderr)
        return 0


def _prog() -> str:
    """How the operator called us: the console script's name, or ``python -m ...``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not name or name in ("__main__.py", "-c", "-m"):
        return "python -m langflow_sandbox_createos"
    return name


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m langflow_sandbox_createos`` and ``langflow-sandbox-createos``."""
    args_in = sys.argv[1:] if argv is None else argv
    # The gateway's options are defined once, natively (the same as the egress-gateway binary's):
    # everything after `gateway` is passed on untouched, `--help` included.
    if args_in[:1] == ["gateway"]:
        return _gateway(args_in[1:])
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="Operator tools for langflow-sandbox-createos: the sandbox backend, the CreateOS "
        "Sandbox component and the whole-flow executor. Start with `doctor`.",
        epilog="`COMMAND --help` describes one command.",
    )
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    doctor = commands.add_parser(
        "doctor",
        help="check each enabled surface's settings, key, control plane and store, and what a run "
        "would get; creates no guest; exits 1 on any problem",
        description="Checks the surfaces that are enabled (the backend, or the opensandbox backend, by "
        "LANGFLOW_SANDBOX_BACKEND / LANGFLOW_SANDBOX_BACKEND_PLUGINS, the executor (on CreateOS or OpenSandbox) by "
        "LANGFLOW_EXECUTOR_KIND, the component when "
        "asked or when nothing else is) and what they share. Creates no guest. Exit status: 0 no "
        "problem, 1 a problem for a checked surface (the last line counts them). Progress goes to "
        "stderr.",
    )
    doctor.add_argument(
        "--surface",
        type=_surfaces,
        action="append",
        metavar="SURFACE",
        help="check this surface (backend, component, executor, opensandbox or opensandbox-executor; repeat or "
        "comma-separate for "
        "several) instead of the enabled ones",
    )
    doctor.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON object (surfaces checked and skipped, findings, verdict, "
        "exit code) for deployment scripts",
    )
    reap = commands.add_parser(
        "reap",
        help="delete orphaned guests: one-shot lf- guests found paused, left by processes that died",
    )
    reap.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    reap.add_argument(
        "--older-than",
        metavar="AGE",
        help="also delete the CreateOS Sandbox component's reused guests (lf-c-) created at least "
        "AGE ago (90s, 30m, 1h, 2d); younger ones are kept and listed",
    )
    reap.add_argument(
        "--provider",
        choices=("createos", "opensandbox"),
        default="createos",
        help="opensandbox: delete this deployment's sandboxes on the OPEN_SANDBOX_DOMAIN server "
        "(created-by metadata) older than --older-than (default 30m); the component's kept "
        "sandboxes (lf-c-) only with an explicit --older-than",
    )
    template = commands.add_parser("template", help="bake a guest image for the whole-flow executor")
    template_commands = template.add_subparsers(dest="template_command", required=True)
    build = template_commands.add_parser(
        "build",
        help="build a CreateOS template with lfx and the packages a flow's components import, "
        "and print the CREATEOS_EXECUTOR_ROOTFS value",
    )
    build.add_argument("flow", help="the flow's JSON file")
    build.add_argument("--name", help="template name (default: derived from what it installs)")
    build.add_argument("--dry-run", action="store_true", help="only print the Dockerfile")
    commands.add_parser(
        "gateway",
        add_help=False,
        help="run the egress gateway (domain allowlists for guests): an HTTP forward proxy that "
        "admits only the host names a guest's signed credential lists; secret from "
        "CREATEOS_GATEWAY_SECRET; `gateway --help` lists its options",
    )
    args = parser.parse_args(args_in)
    if args.command is None:
        # No command: say what there is, on stderr, and fail as a usage error does.
        parser.print_help(sys.stderr)
        return 2
    if args.command == "doctor":
        repeated: list[list[str]] = args.surface or []
        asked = [name for names in repeated for name in names]
        return _doctor(asked, args.json)
    if args.command == "reap":
        if args.provider == "opensandbox":
            return _reap_opensandbox(args.older_than, args.dry_run)
        rc = _reap(args.dry_run)
        if args.older_than is not None:
            rc = max(rc, _reap_reused(args.older_than, args.dry_run))
        return rc
    if args.command == "template":
        return _template_build(args.flow, args.name, args.dry_run)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
