from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class StreamWordsComponent(Component):
    display_name = "Stream Words"
    description = "Streams the text back word by word, as a model would."
    icon = "waves"
    name = "StreamWords"
    inputs = [MessageTextInput(name="text", display_name="Text")]
    outputs = [Output(display_name="Streamed", name="streamed", method="streamed")]

    def streamed(self) -> Message:
        words = str(self.text).split()

        async def chunks():
            for i, word in enumerate(words):
                yield word if i == 0 else " " + word

        message = Message()
        message.text = chunks()  # a pending stream, as a model's streaming response is
        return message
