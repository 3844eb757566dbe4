"""Splits a text into words (one Data each): the Loop flow's input."""

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.data import Data
from lfx.schema.dataframe import DataFrame


class WordsComponent(Component):
    display_name = "Words"
    description = "One row per word of the text."
    icon = "list"
    name = "Words"
    inputs = [MessageTextInput(name="text", display_name="Text")]
    outputs = [Output(display_name="Words", name="words", method="split")]

    def split(self) -> DataFrame:
        return DataFrame([Data(data={"text": word}) for word in str(self.text).split()])
