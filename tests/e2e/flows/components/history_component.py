from lfx.custom.custom_component.component import Component
from lfx.io import MessageInput, Output
from lfx.memory import aget_messages
from lfx.memory.flow_context import coerce_flow_id, resolve_message_owner_id
from lfx.schema.message import Message


class HistoryProbeComponent(Component):
    display_name = "History Probe"
    description = "Reads the session's chat history through lfx's memory API, as Message History does."
    icon = "message-square-more"
    name = "HistoryProbe"
    inputs = [MessageInput(name="message", display_name="Message")]
    outputs = [Output(display_name="History", name="history", method="history")]

    async def history(self) -> Message:
        messages = await aget_messages(
            session_id=self.graph.session_id,
            flow_id=coerce_flow_id(self.graph.flow_id),
            user_id=resolve_message_owner_id(self.graph),
            order="ASC",
        )
        seen = " | ".join(f"{m.sender}:{m.text}" for m in messages)
        return Message(text=f"{len(messages)} messages: {seen}")
