"""Registry of methods: adding one is a new module plus a line here."""

from pipeline.algorithms.fedcache import FedCache
from pipeline.algorithms.local import LocalOnly

REGISTRY = {cls.name: cls for cls in (FedCache, LocalOnly)}
