"""Registry of methods: adding one is a new module plus a line here."""

from pipeline.algorithms.fd import FD
from pipeline.algorithms.fedalt import FedAlt
from pipeline.algorithms.fedavg import FedAvg
from pipeline.algorithms.fedcache import FedCache
from pipeline.algorithms.feddkc import FedDKC
from pipeline.algorithms.fedict import FedICT
from pipeline.algorithms.fedproto import FedProto
from pipeline.algorithms.local import LocalOnly
from pipeline.algorithms.mtfl import MTFL
from pipeline.algorithms.pdfl import PDFL
from pipeline.algorithms.pfedme import PFedMe

REGISTRY = {cls.name: cls for cls in (FedCache, FD, FedAvg, FedProto, LocalOnly, PDFL, FedAlt, MTFL, PFedMe,
                                      FedDKC, FedICT)}
