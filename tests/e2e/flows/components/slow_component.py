import time

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class SlowComponent(Component):
    display_name = "Slow"
    description = "Waits two seconds, then passes the text on."
    icon = "clock"
    name = "Slow"
    inputs = [MessageTextInput(name="text", display_name="Text")]
    outputs = [Output(display_name="Text", name="later", method="later")]

    def later(self) -> Message:
        time.sleep(2)
        return Message(text=f"{self.text} (after 2 s)")
