"""A model's own chat template, rendered in a sandbox and matched against our formats
(model/templates.py); docs/chat-formats.md."""
