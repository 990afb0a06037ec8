"""The knowledge cache: the neighbour index (faiss) and its SQL store (SQLAlchemy)."""
