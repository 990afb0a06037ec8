"""The hashing and index stages: the fixed encoder, the hash codes, the neighbour search and the
knowledge-cache store (SQLite through SQLAlchemy)."""
