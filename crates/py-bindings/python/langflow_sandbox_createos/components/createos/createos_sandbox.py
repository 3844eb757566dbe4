"""The CreateOS Sandbox node: a CreateOS Firecracker microVM as a step of a flow.

lfx runs the copy of this source embedded in each flow, so it imports the installed wheel's
package by absolute name. The class only gathers the node's inputs and builds lfx's ``Data``,
``Message`` and ``DataFrame`` from what the native extension returns; refusals, guest reuse,
egress, timeouts and the safe reading of returned files are decided in Rust.

The description is static (Langflow 1.13 does not refresh it when an input changes, so it
must never state a policy); the policy a run got is the node's status after that run.
"""

# lfx's inputs and outputs are pydantic models assembled from mixins, whose fields pyright
# cannot see ("No parameter named ..."), and Component's tool and frontend-node hooks are
# untyped; the rest of this file is checked strictly.
# pyright: reportCallIssue=false, reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false

from __future__ import annotations

from typing import Any

from lfx.custom.custom_component.component import Component
from lfx.io import BoolInput, DropdownInput, IntInput, MultilineInput, Output, StrInput
from lfx.schema.data import Data
from lfx.schema.dataframe import DataFrame
from lfx.schema.message import Message

from langflow_sandbox_createos import node


def _text(value: Any) -> str:
    """An input's text: a Message's ``text``, a plain string, or empty."""
    if value is None:
        return ""
    text = getattr(value, "text", value)
    return text if isinstance(text, str) else str(text)


class CreateOSSandboxComponent(Component):
    """Runs Python code or a shell command in a CreateOS microVM.

    Both outputs come from one execution per build: whichever is resolved first runs it,
    the other reuses its outcome. Nothing outlives the build on the instance; a kept guest
    is found again by its name, which Rust derives from the flow, the node and the policy.
    """

    display_name = "CreateOS Sandbox"
    description = node.DESCRIPTION
    icon = "square-terminal"
    name = "CreateOSSandbox"

    # Component declares `list[InputTypes]`, a union pyright does not match these classes to.
    inputs = [  # pyright: ignore[reportAssignmentType]
        MultilineInput(
            name="python_code",
            display_name="Python Code",
            info="Python run with python3 inside the microVM. Write files to $ARTIFACTS_DIR (or "
            "/workspace/artifacts) to return them on the Files output.",
            value="print('hello from a microVM')",
            input_types=["Message"],
            tool_mode=True,
        ),
        StrInput(
            name="command",
            display_name="Command",
            info="A shell command run with sh -c instead of the Python code, when set. It travels "
            "in the exec request: at most 64 KiB (65536 bytes); a longer script belongs in Python "
            "Code, which is uploaded.",
            value="",
            advanced=True,
        ),
        DropdownInput(
            name="session_mode",
            display_name="Guest Reuse",
            options=["off", "flow", "session"],
            value="off",
            info="off: a fresh microVM per run, destroyed afterwards. flow: one microVM per flow "
            "and node, kept between runs and shared by everyone who runs the flow. session: one "
            "per flow, node and Langflow session (chat). Kept ones carry packages and files over "
            "(reap old ones); both need a saved flow.",
        ),
        BoolInput(
            name="collect_artifacts",
            display_name="Return Files",
            value=False,
            info="Hand back what this run wrote to its own $ARTIFACTS_DIR, which /workspace/artifacts "
            "links to (at most 256 regular files, a 5 MiB archive), on the Files output; never an "
            "earlier run's files.",
        ),
        BoolInput(
            name="allow_network",
            display_name="Allow Network",
            value=False,
            info="On: unrestricted egress. Off: deny-all, except 169.254.0.0/16 (the VM metadata "
            "service), which CreateOS keeps reachable: accept that with Accept Link-Local Egress.",
        ),
        BoolInput(
            name="accept_egress_exceptions",
            display_name="Accept Link-Local Egress",
            value=False,
            info="With Allow Network off, run although the guest can still reach 169.254.0.0/16 "
            "(the VM metadata service), which CreateOS never blocks; off, such a run is refused. "
            "The operator accepts it for every node with "
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true.",
        ),
        StrInput(
            name="allowed_domains",
            display_name="Allowed Domains",
            value="",
            info="With Allow Network on: comma-separated host names (pypi.org, *.pythonhosted.org) "
            "that are then the only ones reachable, through the operator's egress gateway "
            "(CREATEOS_GATEWAY_URL); programs must honour the proxy variables. Blank: Allow "
            "Network's meaning.",
            advanced=True,
        ),
        IntInput(
            name="timeout_seconds",
            display_name="Timeout (seconds)",
            value=60,
            info="Wall clock of the program, enforced inside the microVM by timeout(1).",
            advanced=True,
        ),
        StrInput(
            name="shape",
            display_name="Shape",
            value="",
            info="CreateOS shape id, e.g. s-2vcpu-4gb. Blank: CREATEOS_SANDBOX_SHAPE, else the "
            "smallest shape with at least 4 GiB.",
            advanced=True,
        ),
        DropdownInput(
            name="provider",
            display_name="Provider",
            options=["CreateOS", "OpenSandbox"],
            value="CreateOS",
            info="Where the guest runs: CreateOS, or the operator's self-hosted OpenSandbox server "
            "(OPEN_SANDBOX_* settings; refused unless its isolation is attested or container "
            "isolation is accepted).",
            advanced=True,
        ),
    ]

    outputs = [
        Output(display_name="Results", name="results", method="run_sandbox"),
        # The program's standard output as text, for a Chat Output or a prompt; not a tool of
        # its own (an agent's tools stay the ones flows saved before it existed).
        Output(display_name="Output Text", name="output_text", method="output_text", type_=Message, tool_mode=False),
        Output(display_name="Files", name="files", method="collected_files", type_=DataFrame),
    ]

    def _pre_run_setup(self) -> None:
        # Each build starts without an execution; its first output method runs one.
        self._createos_execution: tuple[tuple[Any, ...], set[str], dict[str, Any], list[dict[str, Any]]] | None = None

    def _node_inputs(self) -> dict[str, Any]:
        vertex = getattr(self, "_vertex", None)
        graph = getattr(vertex, "graph", None)
        flow_id = getattr(graph, "flow_id", None)
        session_id = getattr(graph, "session_id", None)
        return {
            "flow_id": "" if flow_id is None else str(flow_id),
            "session_id": "" if session_id is None else str(session_id),
            "component_id": str(self.get_id()),
            "python_code": _text(self.python_code),
            "command": _text(self.command),
            "session_mode": _text(self.session_mode) or "off",
            "collect_artifacts": bool(self.collect_artifacts),
            "allow_network": bool(self.allow_network),
            "accept_egress_exceptions": bool(getattr(self, "accept_egress_exceptions", False)),
            "allowed_domains": _text(getattr(self, "allowed_domains", "")),
            "timeout_seconds": int(self.timeout_seconds if self.timeout_seconds is not None else 60),
            "shape": _text(self.shape),
            "provider": self._provider(),
        }

    def _execution(self, output: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The outcome of this build's execution, running it if ``output`` already had it.

        The first output method of a build runs the sandbox; the other output of the same
        build takes the same outcome. A method called again (a tool called twice) runs again.
        """
        inputs = self._node_inputs()
        key = tuple(sorted(inputs.items()))
        memo = getattr(self, "_createos_execution", None)
        if memo is not None and memo[0] == key and output not in memo[1]:
            memo[1].add(output)
            return memo[2], memo[3]
        results, files = node.run(**inputs)
        self._createos_execution = (key, {output}, results, files)
        return results, files

    def _show_status(self, results: dict[str, Any]) -> None:
        """The node's status after a run: the guest, the exit code and the policy it ran under."""
        self.status = node.status_text(
            results,
            allow_network=bool(self.allow_network),
            session_mode=_text(self.session_mode) or "off",
            accept_egress_exceptions=bool(getattr(self, "accept_egress_exceptions", False)),
            provider=self._provider(),
        )

    def _provider(self) -> str:
        """The node's Provider as the package spells it (``createos`` or ``opensandbox``)."""
        # Flows saved before the node had Provider run on CreateOS.
        return (_text(getattr(self, "provider", "")) or "CreateOS").lower()

    def run_sandbox(self) -> Data:
        """Results: stdout as ``result``, ``stderr``, ``exit_code``, the guest, the timings."""
        results, _ = self._execution("results")
        self._show_status(results)
        return Data(data=dict(results))

    def output_text(self) -> Message:
        """Output Text: the program's standard output (trimmed), as a message."""
        results, _ = self._execution("output_text")
        self._show_status(results)
        return Message(text=str(results.get("result") or ""))

    def collected_files(self) -> DataFrame:
        """Files: one row per returned file (``path``, ``size``, ``text`` or ``base64``)."""
        results, files = self._execution("files")
        self._show_status(results)
        return DataFrame([dict(row) for row in files], columns=["path", "size", "text", "base64"])

    async def _get_tools(self) -> list[Any]:
        tools = await super()._get_tools()
        # An agent learns the network policy and the reuse mode from the tool, not from a
        # timeout.
        description = node.describe(
            bool(self.allow_network),
            _text(self.session_mode) or "off",
            bool(getattr(self, "accept_egress_exceptions", False)),
            self._provider(),
        )
        for tool in tools:
            tool.description = description
        return tools
