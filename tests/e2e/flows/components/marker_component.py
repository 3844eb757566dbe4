"""Marker: a component whose code says which process evaluated it (issue 46).

Each place where Langflow or lfx can run a component's code writes a marker file named after
the place and the writing process's pid: the module level (a top-level assignment, which lfx
evaluates when it rebuilds the class), the class body, ``__init__`` and the build method. The
folder is ``LFSC_MARKER_DIR`` when set (the tests set it for the host process only: a guest's
environment does not have it), else ``lfsc-e2e-markers`` in the temporary directory. The build
method answers with the four markers of the process it ran in, so the answer itself says where
everything ran.
"""

import os
import tempfile

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


def _mark(where):
    folder = os.environ.get("LFSC_MARKER_DIR") or os.path.join(tempfile.gettempdir(), "lfsc-e2e-markers")
    os.makedirs(folder, exist_ok=True)
    name = f"{where}-{os.getpid()}"
    with open(os.path.join(folder, name), "a", encoding="utf-8") as f:
        f.write(where + "\n")
    return name


_MODULE_MARK = _mark("module")


class MarkerComponent(Component):
    display_name = "Marker"
    description = "Writes a marker file wherever its code runs and answers with the markers."
    icon = "flag"
    name = "Marker"
    inputs = [MessageTextInput(name="text", display_name="Text")]
    outputs = [Output(display_name="Markers", name="markers", method="build_markers")]

    _class_mark = _mark("class")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._init_mark = _mark("init")

    def build_markers(self) -> Message:
        marks = [_MODULE_MARK, self._class_mark, self._init_mark, _mark("build")]
        return Message(text=" ".join(marks))
