from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class ShoutComponent(Component):
    display_name = "Shout"
    description = "Upper-cases the text and says where it ran."
    icon = "type"
    name = "Shout"
    inputs = [MessageTextInput(name="text", display_name="Text")]
    outputs = [Output(display_name="Shouted", name="shouted", method="shout")]

    def shout(self) -> Message:
        return Message(text=str(self.text).upper() + "!")
