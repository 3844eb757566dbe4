"""Streams the text back word by word as a chat model's chunks: the token stream of the Playground."""

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class TokensComponent(Component):
    display_name = "Tokens"
    description = "Streams the text back word by word, as a chat model's chunks."
    icon = "waves"
    name = "Tokens"
    inputs = [MessageTextInput(name="text", display_name="Text")]
    outputs = [Output(display_name="Answer", name="answer", method="answer")]

    def answer(self) -> Message:
        import asyncio

        from langchain_core.messages import AIMessageChunk

        words = str(self.text).upper().split()

        async def chunks():
            for i, word in enumerate(words):
                await asyncio.sleep(0.05)
                yield AIMessageChunk(content=word if i == 0 else " " + word)

        message = Message()
        message.text = chunks()  # a pending stream, as a model's streaming response is
        return message
