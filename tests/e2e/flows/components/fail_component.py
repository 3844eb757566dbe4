"""Raises: the failing flow of the Playground's parity tests."""

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class FailComponent(Component):
    display_name = "Fail"
    description = "Raises a ValueError naming its input."
    icon = "x"
    name = "Fail"
    inputs = [MessageTextInput(name="text", display_name="Text")]
    outputs = [Output(display_name="Never", name="never", method="fail")]

    def fail(self) -> Message:
        msg = f"this flow fails on purpose: {self.text}"
        raise ValueError(msg)
