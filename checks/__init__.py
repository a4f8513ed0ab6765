"""Built-in checks: one module per check, listed explicitly in ``ALL_CHECKS``.

The order is the bootstrap suite's order: cheap first (inventory, the passive one-shots, ECC,
PCIe, NVLink), then DCGM, RDMA loopback, burn-in, NCCL and the SDC probe. Importing this package
loads none of torch, pynvml or kubernetes; checks import heavy modules lazily.
"""

from checks.burn_in import BurnIn
from checks.dcgm_diag import DcgmDiag
from checks.ecc_memory import EccMemory
from checks.inventory import Inventory
from checks.nccl_allreduce import NcclAllreduce
from checks.nvlink_peer import NvlinkPeer
from checks.nvlink_state import NvlinkState
from checks.nvswitch import NvSwitch
from checks.pcie import Pcie
from checks.pcie_aer import PcieAer
from checks.power import Power
from checks.rdma_loopback import RdmaLoopback
from checks.rdma_ports import RdmaPorts
from checks.sdc_probe import SdcProbe
from checks.temperature import Temperature
from checks.throttle import Throttle
from checks.xid import Xid

ALL_CHECKS = (
    Inventory,
    Xid,
    NvSwitch,
    PcieAer,
    RdmaPorts,
    NvlinkState,
    Throttle,
    Temperature,
    Power,
    EccMemory,
    Pcie,
    NvlinkPeer,
    DcgmDiag,
    RdmaLoopback,
    BurnIn,
    NcclAllreduce,
    SdcProbe,
)

__all__ = ["ALL_CHECKS"]
