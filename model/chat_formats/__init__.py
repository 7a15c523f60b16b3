"""A model's own chat template, rendered in a sandbox and matched against our formats
(model/chat_formats/templates.py); docs/chat-formats.md."""
