"""cuda-python's driver as SGLang's fusion workspace preflight calls it, on a CPU rank (tests/gpu/test_harness.py,
tests/patches); `_fake_cuda`, as tests/conftest.py puts tests/ on sys.path."""

import os
from types import SimpleNamespace


class FakeCudaDriver:
    """The cuda-python driver calls of the fusion workspace preflight, on a CPU rank: sizes from the allocation
    granularity (2 MiB), multicast as asked (a PCIe-only GPU has none: its granularity call answers not supported),
    and shareable handles that are real file descriptors (so FlashInfer's own SCM_RIGHTS exchange moves them).
    `fail` names the call that fails on this rank; `calls` lists the calls made, `created` the sizes allocated."""

    # the driver's enums and structs, as far as the preflight reads them
    CUresult = SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_INVALID_VALUE=1, CUDA_ERROR_NOT_SUPPORTED=801)
    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED=132)
    CUmemAllocationGranularity_flags = SimpleNamespace(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)
    CUmemAccess_flags = SimpleNamespace(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
    CUmulticastGranularity_flags = SimpleNamespace(CU_MULTICAST_GRANULARITY_RECOMMENDED=1)
    CUmemAccessDesc = CUmulticastObjectProp = SimpleNamespace

    def __init__(self, fail: str | None = None, multicast=False, granularity=2 << 20, mc_granularity=512 << 20):
        self.fail, self.multicast, self.granularity, self.mc_granularity = fail, multicast, granularity, mc_granularity
        self.calls: list[str] = []
        self.created: list[int] = []

    def _answer(self, name, *values):
        self.calls.append(name)
        return (self.CUresult.CUDA_ERROR_INVALID_VALUE if name == self.fail else self.CUresult.CUDA_SUCCESS, *values)

    def cuDeviceGetAttribute(self, attr, device):
        return self._answer("cuDeviceGetAttribute", int(self.multicast))

    def cuMemGetAllocationGranularity(self, prop, flags):
        return self.CUresult.CUDA_SUCCESS, self.granularity

    def cuMulticastGetGranularity(self, prop, flags):
        self.calls.append("cuMulticastGetGranularity")
        if not self.multicast:
            return self.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0
        return self.CUresult.CUDA_SUCCESS, self.mc_granularity

    def cuMemCreate(self, size, prop, flags):
        self.created.append(size)
        return self._answer("cuMemCreate", len(self.created))

    def cuMemRelease(self, handle):
        return self._answer("cuMemRelease")

    def cuMemExportToShareableHandle(self, handle, handle_type, flags):
        return self._answer("cuMemExportToShareableHandle", os.open(os.devnull, os.O_RDONLY))

    def cuMemImportFromShareableHandle(self, fd, handle_type):
        os.fstat(fd)  # a descriptor FlashInfer's exchange delivered
        return self._answer("cuMemImportFromShareableHandle", 1000 + fd)

    def cuMemAddressReserve(self, size, alignment, addr, flags):
        return self._answer("cuMemAddressReserve", 1 << 40)

    def cuMemMap(self, ptr, size, offset, handle, flags):
        return self._answer("cuMemMap")

    def cuMemSetAccess(self, ptr, size, descs, count):
        return self._answer("cuMemSetAccess")

    def cuMemUnmap(self, ptr, size):
        return self._answer("cuMemUnmap")

    def cuMemAddressFree(self, ptr, size):
        return self._answer("cuMemAddressFree")
