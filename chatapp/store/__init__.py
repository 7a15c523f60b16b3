"""Kept chats, persistence only: the database, the KV snapshots, the model identity, export, atomic files."""
