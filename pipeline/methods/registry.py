"""Registry of methods: adding one is a new module plus a line here."""

from pipeline.methods.fd.method import FD
from pipeline.methods.fedalt.method import FedAlt
from pipeline.methods.fedavg.method import FedAvg
from pipeline.methods.fedcache.method import FedCache
from pipeline.methods.feddkc.method import FedDKC
from pipeline.methods.fedict.method import FedICT
from pipeline.methods.fedproto.method import FedProto
from pipeline.methods.local.method import LocalOnly
from pipeline.methods.mtfl.method import MTFL
from pipeline.methods.pdfl.method import PDFL
from pipeline.methods.pfedme.method import PFedMe

REGISTRY = {cls.name: cls for cls in (FedCache, FD, FedAvg, FedProto, LocalOnly, PDFL, FedAlt, MTFL, PFedMe,
                                      FedDKC, FedICT)}
