from lfx.custom.custom_component.component import Component
from lfx.io import DataFrameInput, Output
from lfx.schema.message import Message


class RowsComponent(Component):
    display_name = "Rows"
    description = "Says how many rows a table has and what its last row is."
    icon = "rows"
    name = "Rows"
    inputs = [DataFrameInput(name="table", display_name="Table")]
    outputs = [Output(display_name="Summary", name="summary", method="summary")]

    def summary(self) -> Message:
        return Message(text=f"{len(self.table)} rows, the last: {self.table.iloc[-1]['name']}")
