from lfx.custom.custom_component.component import Component
from lfx.io import IntInput, MessageTextInput, Output
from lfx.schema.dataframe import DataFrame
from lfx.schema.message import Message

SENTENCE = "The quick brown fox jumps over the lazy dog, and the dog does not mind at all. "


class BulkComponent(Component):
    display_name = "Bulk"
    description = "Returns a few hundred KB of text and a table of a few thousand rows."
    icon = "table"
    name = "Bulk"
    inputs = [
        MessageTextInput(name="text", display_name="Text"),
        IntInput(name="text_kb", display_name="Text KB", value=300),
        IntInput(name="rows", display_name="Rows", value=3000),
    ]
    outputs = [
        Output(display_name="Text", name="long_text", method="long_text"),
        Output(display_name="Table", name="table", method="table"),
    ]

    def long_text(self) -> Message:
        repeats = self.text_kb * 1024 // len(SENTENCE) + 1
        return Message(text=(str(self.text) + ": " + SENTENCE * repeats)[: self.text_kb * 1024])

    def table(self) -> DataFrame:
        return DataFrame(
            [
                {"row": i, "name": f"item {i}", "score": i / 7, "even": i % 2 == 0, "note": SENTENCE[: i % 40]}
                for i in range(self.rows)
            ]
        )
