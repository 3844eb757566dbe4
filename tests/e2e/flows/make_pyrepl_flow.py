"""Regenerate ``pyrepl_flow.json`` with lfx's Graph API (run once; the JSON is committed).

ChatInput -> Python Interpreter -> ChatOutput: the chat message is the Python code, the
Interpreter runs it (in the sandbox when one is configured), and its JSON result is the reply.

    .venv/bin/python tests/e2e/flows/make_pyrepl_flow.py
"""

from __future__ import annotations

import json
from pathlib import Path

from lfx.components.input_output import ChatInput, ChatOutput
from lfx.components.utilities.python_repl_core import PythonREPLComponent
from lfx.graph import Graph


def build() -> Graph:
    chat_in = ChatInput(_id="chat_in")
    repl = PythonREPLComponent(_id="python_repl")
    repl.set(python_code=chat_in.message_response, global_imports="math")
    chat_out = ChatOutput(_id="chat_out")
    chat_out.set(input_value=repl.run_python_repl)
    return Graph(chat_in, chat_out)


if __name__ == "__main__":
    out = Path(__file__).with_name("pyrepl_flow.json")
    dump = build().dump(name="CreateOS sandbox: Python Interpreter", description="Runs the chat message as Python")
    out.write_text(json.dumps(dump, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")
