"""Joins a table's ``text`` column into one message: the Loop flow's end."""

from lfx.custom.custom_component.component import Component
from lfx.io import DataFrameInput, Output
from lfx.schema.message import Message


class JoinComponent(Component):
    display_name = "Join"
    description = "The table's text column, joined by spaces."
    icon = "merge"
    name = "Join"
    inputs = [DataFrameInput(name="table", display_name="Table")]
    outputs = [Output(display_name="Joined", name="joined", method="join")]

    def join(self) -> Message:
        table = self.table
        words = [str(v) for v in table["text"].tolist()] if "text" in getattr(table, "columns", []) else []
        return Message(text=" ".join(words))
