"""The app: the conversation session and its commands, headless mode, the TUI and the CLI."""
