"""Regenerate the executor's test flows with lfx's Graph API (run once; the JSON is committed).

- ``shout_flow.json``: Chat Input -> Shout (upper-cases, adds "!") -> Chat Output.
- ``slow_flow.json``: Chat Input -> Shout -> Slow (sleeps 2 s) -> Chat Output; the benchmark's
  flow: the first vertices finish long before the last, so live events are measurable.
- ``stream_flow.json``: Chat Input -> Stream Words (a generator output) -> Chat Output.
- ``hostile_flow.json``: Chat Input -> Hostile (writes a raw line to the runner's frame stream, as
  the input says) -> Chat Output.
- ``bulk_flow.json``: Chat Input -> Bulk (a few hundred KB of text and a table of a few thousand
  rows) -> Chat Output (the text), and the table -> Rows (its count and last row) -> a second Chat
  Output.
- ``secret_flow.json``: Chat Input -> Secret Probe (a secret input that loads from the global
  variable ``EXEC_TEST_CREDENTIAL``; it answers with a digest of the value) -> Chat Output.
- ``history_flow.json``: Chat Input -> History Probe (reads the session's history through
  ``lfx.memory.aget_messages``) -> Chat Output.
- ``file_flow.json``: File (lfx's File component; the test points its path at an upload) -> Chat
  Output.
- ``big_flow.json``: Chat Input -> Big (answers with as many ``x`` as the input says) -> Chat
  Output; a 5 MB answer is a 20 MB vertex frame, which the runner sends in pieces.
- ``tokens_flow.json``: Chat Input -> Tokens (the text upper-cased, streamed as a chat model's
  chunks) -> Chat Output, which streams them as ``token`` events in the Playground.
- ``fail_flow.json``: Chat Input -> Fail (raises a ValueError) -> Chat Output.
- ``branch_flow.json``: Chat Input -> If-Else (``yes`` or not) -> Shout on each branch -> a Chat
  Output each: one branch runs, the other is inactivated.
- ``loop_flow.json``: Chat Input -> Words (a row per word) -> Loop (Upper on each item, fed back)
  -> Join (the done table's words) -> Chat Output.
- ``marker_flow.json``: Chat Input -> Marker (writes a marker file, named after the writing
  process, at module level, in its class body, in ``__init__`` and in its build method; answers
  with the four) -> Chat Output: which process evaluated the flow's code (issue 46).

The components live in ``components/``, one per module: a dumped node embeds its module's
source, which is what the guest rebuilds.

    .venv/bin/python tests/e2e/flows/make_executor_flows.py [NAME ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "components"))

from big_component import BigComponent  # noqa: E402
from bulk_component import BulkComponent  # noqa: E402
from history_component import HistoryProbeComponent  # noqa: E402
from hostile_component import HostileComponent  # noqa: E402
from lfx.components.files_and_knowledge.file import FileComponent  # noqa: E402
from lfx.components.input_output import ChatInput, ChatOutput  # noqa: E402
from rows_component import RowsComponent  # noqa: E402
from secret_component import SecretProbeComponent  # noqa: E402
from lfx.graph import Graph  # noqa: E402
from marker_component import MarkerComponent  # noqa: E402
from shout_component import ShoutComponent  # noqa: E402
from slow_component import SlowComponent  # noqa: E402
from stream_component import StreamWordsComponent  # noqa: E402
from tokens_component import TokensComponent  # noqa: E402
from fail_component import FailComponent  # noqa: E402
from lfx.components.flow_controls.conditional_router import ConditionalRouterComponent  # noqa: E402
from lfx.components.flow_controls.loop import LoopComponent  # noqa: E402
from join_component import JoinComponent  # noqa: E402
from upper_component import UpperComponent  # noqa: E402
from words_component import WordsComponent  # noqa: E402


def chat_through(make: Any, input_name: str, output_name: str) -> Graph:
    """Chat Input -> ``make()`` (the message into its ``input_name``) -> Chat Output (its ``output_name``)."""
    chat_in = ChatInput(_id="chat_in")
    middle = make()
    middle.set(**{input_name: chat_in.message_response})
    chat_out = ChatOutput(_id="chat_out")
    chat_out.set(input_value=getattr(middle, output_name))
    return Graph(chat_in, chat_out)


def shout() -> Graph:
    return chat_through(lambda: ShoutComponent(_id="shout"), "text", "shout")


def slow() -> Graph:
    chat_in = ChatInput(_id="chat_in")
    loud = ShoutComponent(_id="shout")
    loud.set(text=chat_in.message_response)
    wait = SlowComponent(_id="slow")
    wait.set(text=loud.shout)
    chat_out = ChatOutput(_id="chat_out")
    chat_out.set(input_value=wait.later)
    return Graph(chat_in, chat_out)


def stream() -> Graph:
    return chat_through(lambda: StreamWordsComponent(_id="stream_words"), "text", "streamed")


def hostile() -> Graph:
    return chat_through(lambda: HostileComponent(_id="hostile"), "mode", "done")


def bulk() -> Graph:
    chat_in = ChatInput(_id="chat_in")
    big = BulkComponent(_id="bulk")
    big.set(text=chat_in.message_response)
    text_out = ChatOutput(_id="text_out")
    text_out.set(input_value=big.long_text)
    rows = RowsComponent(_id="rows")
    rows.set(table=big.table)
    table_out = ChatOutput(_id="table_out")
    table_out.set(input_value=rows.summary)
    graph = Graph()
    for component in (chat_in, big, text_out, rows, table_out):
        graph.add_component(component)
    graph.prepare()
    return graph


def secret() -> Graph:
    return chat_through(lambda: SecretProbeComponent(_id="secret"), "text", "answer")


def history() -> Graph:
    return chat_through(lambda: HistoryProbeComponent(_id="history"), "message", "history")


def file() -> Graph:
    reader = FileComponent(_id="file")
    chat_out = ChatOutput(_id="chat_out")
    chat_out.set(input_value=reader.load_files_message)
    return Graph(reader, chat_out)


def big() -> Graph:
    return chat_through(lambda: BigComponent(_id="big"), "size", "text")


def marker() -> Graph:
    return chat_through(lambda: MarkerComponent(_id="marker"), "text", "build_markers")


def tokens() -> Graph:
    return chat_through(lambda: TokensComponent(_id="tokens"), "text", "answer")


def fail() -> Graph:
    return chat_through(lambda: FailComponent(_id="fail"), "text", "fail")


def branch() -> Graph:
    chat_in = ChatInput(_id="chat_in")
    router = ConditionalRouterComponent(_id="router")
    router.set(input_text=chat_in.message_response, match_text="yes", operator="equals")
    yes = ShoutComponent(_id="shout_yes")
    yes.set(text=router.true_response)
    no = ShoutComponent(_id="shout_no")
    no.set(text=router.false_response)
    out_yes = ChatOutput(_id="out_yes")
    out_yes.set(input_value=yes.shout)
    out_no = ChatOutput(_id="out_no")
    out_no.set(input_value=no.shout)
    graph = Graph()
    for component in (chat_in, router, yes, no, out_yes, out_no):
        graph.add_component(component)
    graph.prepare()
    return graph


def loop() -> Graph:
    chat_in = ChatInput(_id="chat_in")
    words = WordsComponent(_id="words")
    words.set(text=chat_in.message_response)
    each = LoopComponent(_id="loop")
    each.set(data=words.split)
    upper = UpperComponent(_id="upper")
    upper.set(item=each.item_output)
    each.set(item=upper.make_upper)
    joined = JoinComponent(_id="join")
    joined.set(table=each.done_output)
    chat_out = ChatOutput(_id="chat_out")
    chat_out.set(input_value=joined.join)
    return Graph(chat_in, chat_out)


FLOWS = {
    "tokens": tokens,
    "fail": fail,
    "branch": branch,
    "loop": loop,
    "shout": shout,
    "slow": slow,
    "stream": stream,
    "hostile": hostile,
    "bulk": bulk,
    "secret": secret,
    "history": history,
    "file": file,
    "big": big,
    "marker": marker,
}

if __name__ == "__main__":
    for name, build in ((n, FLOWS[n]) for n in (sys.argv[1:] or FLOWS)):
        out = HERE / f"{name}_flow.json"
        dump = build().dump(name=f"CreateOS executor: {name}", description=f"The executor's {name} test flow")
        out.write_text(json.dumps(dump, indent=1, sort_keys=True) + "\n")
        print(f"wrote {out}")
