"""The Textual app: `ChatApp(args).run()`. Imports nothing heavy, so the first frame is fast."""
