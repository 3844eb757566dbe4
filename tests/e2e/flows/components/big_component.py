from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class BigComponent(Component):
    display_name = "Big"
    description = "Answers with as many x as its input says (a large answer, for the executor's chunked frames)."
    icon = "maximize"
    name = "Big"
    inputs = [MessageTextInput(name="size", display_name="Size")]
    outputs = [Output(display_name="Text", name="text", method="text")]

    def text(self) -> Message:
        return Message(text="x" * int(str(self.size).strip()))
