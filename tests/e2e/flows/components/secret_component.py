import hashlib
import os
import sys

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output, SecretStrInput
from lfx.schema.message import Message


class SecretProbeComponent(Component):
    display_name = "Secret Probe"
    description = "Says which credential it was given (a digest, never the value)."
    icon = "key"
    name = "SecretProbe"
    inputs = [
        MessageTextInput(name="text", display_name="Text"),
        SecretStrInput(name="api_key", display_name="API Key", value="EXEC_TEST_CREDENTIAL", load_from_db=True),
    ]
    outputs = [Output(display_name="Answer", name="answer", method="answer")]

    def answer(self) -> Message:
        key = self.api_key
        if hasattr(key, "get_secret_value"):
            key = key.get_secret_value()
        # The runner deletes its job (which holds the key) before the flow runs; in-process
        # there is no job next to the script either.
        job = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "lfx_job.json")
        where = "job file present" if os.path.exists(job) else "no job file"
        if not key:
            return Message(text=f"{self.text}: no key; {where}")
        # What the flow prints reaches the host's log (from a guest: relayed, the key masked).
        print(f"secret probe got the key {key}", file=sys.stderr, flush=True)
        digest = hashlib.sha256(str(key).encode()).hexdigest()[:16]
        return Message(text=f"{self.text}: key sha256:{digest} ({len(str(key))} chars); {where}")
