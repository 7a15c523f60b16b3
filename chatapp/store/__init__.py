"""Kept chats: the database, the KV snapshots, the model identity, the keeper, reopening a chat, export."""
