"""The ``createos`` bundle: the CreateOS Sandbox component."""
