"""Upper-cases one Data's text: the Loop flow's body."""

from lfx.custom.custom_component.component import Component
from lfx.io import DataInput, Output
from lfx.schema.data import Data


class UpperComponent(Component):
    display_name = "Upper"
    description = "Upper-cases a Data's text."
    icon = "type"
    name = "Upper"
    inputs = [DataInput(name="item", display_name="Item")]
    outputs = [Output(display_name="Upper", name="upper_item", method="make_upper")]

    def make_upper(self) -> Data:
        item = self.item
        text = item.data.get("text", "") if isinstance(item, Data) else str(item)
        return Data(data={"text": str(text).upper()})
