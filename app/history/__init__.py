"""Saved conversations: the data model and the SQLite store, its schema, opening and salvage."""
