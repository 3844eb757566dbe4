"""Regenerate the CreateOS Sandbox flows with lfx's Graph API (run once; the JSON is committed).

- ``component_flow.json``: Chat Input -> CreateOS Sandbox -> Chat Output. The chat message is
  the node's Python code and its Results are the reply.
- ``component_files_flow.json``: the same, with the node's Files table as the reply, one
  line per row through a Parser (only that output is connected, so resolving it runs the
  sandbox by itself).
- ``component_both_flow.json``: Results and Files each to a Chat Output (one build resolves
  both outputs of the node; they must come from one run).
- ``component_text_flow.json``: the node's Output Text (the program's standard output as a
  message) straight to a Chat Output.

Each is written as Langflow's export writes a flow: the graph under ``data``, with the flow's
``id``, ``name`` and ``description`` around it (a fixed id per file, so the files do not change
when regenerated). ``lfx run`` of such a file keeps only the graph; Guest Reuse takes the flow's
id from the file (the tests that need a flow without one remove it).

The node's settings (Guest Reuse, Allow Network, Return Files, ...) are the component's
defaults here; the tests edit them in a copy, as a user would on the canvas.

    .venv/bin/python tests/e2e/flows/make_component_flow.py
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from lfx.components.input_output import ChatInput, ChatOutput
from lfx.components.processing.parser import ParserComponent
from lfx.graph import Graph

from langflow_sandbox_createos.components.createos.createos_sandbox import CreateOSSandboxComponent


# One line per row of the Files table: every column, tab-separated, text as a repr.
FILE_ROW = "FILE\t{path}\t{size}\t{text!r}\t{base64}"


def build(output: str) -> Graph:
    chat_in = ChatInput(_id="chat_in")
    sandbox = CreateOSSandboxComponent(_id="createos_sandbox")
    sandbox.set(python_code=chat_in.message_response)
    chat_out = ChatOutput(_id=f"chat_out_{output}")
    if output == "results":
        chat_out.set(input_value=sandbox.run_sandbox)
    elif output == "text":
        chat_out.set(input_value=sandbox.output_text)
    else:
        # The table, one line per row (Chat Output would render it with `tabulate`, which lfx
        # does not install).
        rows = ParserComponent(_id="files_parser")
        rows.set(input_data=sandbox.collected_files, mode="Parser", pattern=FILE_ROW, sep="\n")
        chat_out.set(input_value=rows.parse_combined_text)
    return Graph(chat_in, chat_out)


def dump(outputs: tuple[str, ...]) -> dict[str, Any]:
    """One flow per output, merged: Graph(start, end) keeps a single path."""
    flows = [
        build(output).dump(
            name=f"CreateOS Sandbox component ({' + '.join(outputs)})",
            description="Runs the chat message as Python in a CreateOS microVM",
        )
        for output in outputs
    ]
    merged = flows[0]
    for extra in flows[1:]:
        ids = {node["id"] for node in merged["data"]["nodes"]}
        merged["data"]["nodes"] += [node for node in extra["data"]["nodes"] if node["id"] not in ids]
        edges = {(edge["source"], edge["target"]) for edge in merged["data"]["edges"]}
        merged["data"]["edges"] += [
            edge for edge in extra["data"]["edges"] if (edge["source"], edge["target"]) not in edges
        ]
    return merged


FLOWS = {
    "component_flow.json": ("results",),
    "component_files_flow.json": ("files",),
    "component_both_flow.json": ("results", "files"),
    "component_text_flow.json": ("text",),
}


def exported_id(file: str) -> str:
    """The fixed flow id written into ``file``, as a Langflow export carries one."""
    url = f"https://github.com/langflow-sandbox-createos/langflow-sandbox-createos/tests/e2e/flows/{file}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, url))


if __name__ == "__main__":
    here = Path(__file__).parent
    for file, outputs in FLOWS.items():
        flow = {**dump(outputs), "id": exported_id(file)}
        (here / file).write_text(json.dumps(flow, indent=1, sort_keys=True) + "\n")
        print(f"wrote {here / file}")
