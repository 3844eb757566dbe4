import json
import sys

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class HostileComponent(Component):
    display_name = "Hostile"
    description = "Writes a raw line to the runner's frame stream, past the runner's own caps."
    icon = "skull"
    name = "Hostile"
    inputs = [MessageTextInput(name="mode", display_name="Mode")]
    outputs = [Output(display_name="Done", name="done", method="done")]

    def done(self) -> Message:
        mode, _, arg = str(self.mode).partition(":")
        frame = {"frame": "vertex", "id": "raw", "display_name": "Raw", "valid": True}
        if mode == "values":
            # `{},{},...`: the cheapest bytes that each become an object on the host.
            body = "[" + ",".join(["{}"] * int(arg)) + "]"
            line = json.dumps(frame)[:-1] + ', "result": {"results": {"r": ' + body + "}}}"
        elif mode == "tagged":
            # Tagged objects: each becomes an lfx Message on the host.
            frame["result"] = {"results": {"r": [{"__lfx__": "Message", "v": {}}] * int(arg)}}
            line = json.dumps(frame)
        elif mode == "chat":
            # Chat messages of a result: each becomes a validated pydantic model on the host.
            frame["result"] = {"results": {}, "messages": [{"message": "", "type": "x"}] * int(arg)}
            line = json.dumps(frame)
        elif mode == "diagonal":
            # Records that share no column: n of them make an n x n table on the host.
            rows = [{f"c{i}": 1} for i in range(int(arg))]
            frame["result"] = {"results": {"r": {"__lfx__": "DataFrame", "v": rows}}}
            line = json.dumps(frame)
        elif mode == "files":
            # A Message naming a path: opening it on the host (to tell an image) could block.
            frame["result"] = {"results": {"r": {"__lfx__": "Message", "v": {"text": "see", "files": [arg]}}}}
            line = json.dumps(frame)
        elif mode == "parity":
            # The JSON text as given, for the host to build as `json.loads` would.
            line = json.dumps(frame)[:-1] + ', "result": {"results": {"r": ' + arg + "}}}"
        elif mode == "string":
            # One astral character makes the whole string 4 bytes per character in Python.
            frame["result"] = {"results": {"r": "\U0001f600" + "x" * int(arg)}}
            line = json.dumps(frame, ensure_ascii=False)
        elif mode == "claim":
            # The first piece of a chunked frame that claims a total far past what a run may send.
            line = json.dumps({"frame": "chunk", "index": 0, "total": int(arg), "data": "{"})
        elif mode == "name":
            frame["display_name"] = "\x1b]0;pwned\x07\x1b[2Jraw"
            line = json.dumps(frame)
        elif mode == "forge":
            # Text that would start lines of the host's log: Unicode separators and a bidi
            # override in what the flow prints, and a failure whose message has lines of its own.
            print("ok\u2028CRITICAL forged-by-separator\u2029x\x85y\u202elive\r\nCRITICAL forged-by-crlf", file=sys.stderr, flush=True)
            msg = "boom\nCRITICAL root: forged-by-exception\r\n\u2028more"
            raise ValueError(msg)
        else:
            return Message(text="nothing written")
        frames = sys.modules["__main__"]._frames
        frames.write(line + "\n")
        frames.flush()
        return Message(text=f"wrote {len(line.encode())} bytes")
