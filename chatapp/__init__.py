"""The app: the conversation session and its commands, headless mode, the TUI and the CLI."""

import model  # noqa: F401  first: its __init__ sets OMP_WAIT_POLICY before anything imports torch
