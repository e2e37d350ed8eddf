"""Stub of the Cython module `nccl._extensions.bindings.nccl_ep` (ext `python/nccl/_extensions/bindings/
nccl_ep.pyx:2600-2615`): a non-zero ncclResult_t raises `NCCLEpError(status)`, whose text is "NCCL EP error code N"
(3 = ncclInternalError, 4 = ncclInvalidArgument, 5 = ncclInvalidUsage). The wheel's libnccl_ep.so reports 0.2.0
(`NCCL_EP_VERSION_CODE` = MAJOR*10000 + MINOR*100 + PATCH).
"""
import os

VERSION_CODE = 200          # libnccl_ep.so of the 0.1.0 wheel: "NCCL EP version 0.2.0+cuda13.3"
LIBRARY_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "ep", "lib", "cu13", "libnccl_ep.so")


class NCCLEpError(Exception):
    def __init__(self, status):
        self.status = status
        super().__init__(f"NCCL EP error code {status}")

    def __reduce__(self):
        return (type(self), (self.status,))


def check_status(status: int):
    if status != 0:
        raise NCCLEpError(status)


def get_version() -> int:
    return VERSION_CODE


def get_library_path() -> str:
    return LIBRARY_PATH
